//! One job's life inside a worker: run the handler, catching a panic and stopping it at
//! its timeout or the shutdown deadline, then hand the outcome to the settler (SPEC W1,
//! W3, W4). Its lease is heartbeated meanwhile by the [keeper](super::keeper), which
//! stops the handler if the lease is lost.
//!
//! The handler runs on one of the worker's [slot tasks](super::slots), so its timeout,
//! the shutdown deadline and the keeper stop it at an `.await`: a handler that blocks
//! its thread is stopped once it yields, and one that returns past its timeout is
//! failed all the same.
//!
//! The slot frees as soon as the outcome is handed to the settler (at once, unless
//! the settler is behind); the keeper goes on heartbeating the lease until the settler
//! has stored the outcome.

use std::{
    any::Any,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use tokio::{
    sync::{Notify, mpsc, watch},
    time::{Instant, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    Handler,
    context::{JobContext, LeaseDeadline},
    keeper,
    slots::Slot,
};
use crate::{ClaimedJob, JobId, Lease, LeaseToken, Outcome, Retry, Settle, validate};

/// An outcome for the settler, with the guard that tells the keeper the job ended once
/// the settler is done with it (stored, given up on, or dropped in a panic).
pub(super) type Settling = (Settle, Ended);

/// What a slot's jobs share: the handler and where their outcomes go.
#[derive(Clone)]
pub(super) struct JobRun {
    pub(super) handler: Arc<dyn Handler>,
    pub(super) timeout: Option<Duration>,
    /// Cancelled when the shutdown deadline passes: the job is released.
    pub(super) abort: CancellationToken,
    pub(super) settle: mpsc::Sender<Settling>,
}

/// A job handed to a slot, with its guards.
pub(super) struct Assigned {
    pub(super) job: ClaimedJob,
    pub(super) control: Arc<Control>,
    pub(super) slot: Slot,
    pub(super) ended: Ended,
}

/// One job's state as its slot and the keeper share it.
#[derive(Default)]
pub(super) struct Control {
    /// Set once the handler's outcome is decided and on its way to the settler: the
    /// keeper no longer stops the job then.
    handed: AtomicBool,
    /// Set when the job's run ended, whatever its end.
    finished: AtomicBool,
    /// Set by the keeper when the lease is lost: the handler must stop.
    stopped: AtomicBool,
    stop: Notify,
    /// Fired whenever the handler is stopped without being waited for, for what it
    /// started outside its future ([`JobContext::stopping`]).
    token: CancellationToken,
    /// The lease's deadline as the keeper reckons it, renewed by each beat through.
    deadline: watch::Sender<Option<LeaseDeadline>>,
}

impl Control {
    pub(super) fn handed(&self) -> bool {
        self.handed.load(Ordering::SeqCst)
    }

    pub(super) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Stops the job without an outcome: someone else owns it now. Its handler is
    /// dropped before it is polled again (or never starts): a handler that blocks its
    /// thread stops once it yields.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // A permit is kept if the job is not waiting yet.
        self.stop.notify_one();
        self.token.cancel();
    }

    /// Whether the keeper stopped the job (its lease lost or run out).
    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Sets the lease's deadline, as the keeper reckons it after a claim or a beat.
    pub(super) fn set_deadline(&self, deadline: LeaseDeadline) {
        self.deadline.send_replace(Some(deadline));
    }

    fn context(&self) -> JobContext {
        JobContext::new(self.token.clone(), self.deadline.subscribe())
    }
}

impl Ended {
    pub(super) fn new(keeper: mpsc::UnboundedSender<keeper::Msg>, lease: &Lease) -> Self {
        Self {
            keeper,
            job: lease.job,
            token: lease.token,
        }
    }
}

impl JobRun {
    /// Runs one job on its slot; the slot frees once the outcome is with the settler,
    /// or at once if the job was stopped.
    pub(super) async fn run(&self, assigned: Assigned) {
        let Assigned {
            job,
            control,
            slot,
            ended,
        } = assigned;
        let _finished = Finished(&control);
        // Its lease was lost while it waited for this slot.
        if control.stopped.load(Ordering::SeqCst) {
            return;
        }
        let lease = job.lease.clone();
        let span = tracing::info_span!("relayq.job", queue = %lease.queue, id = %lease.job, attempt = lease.attempt);
        // Dropping this future (timeout, shutdown, or the keeper stopping the job) stops
        // the handler; `async` so that a panic in `handle` itself is caught too. It runs
        // here, on the slot's task, so it borrows the handler rather than owning a clone.
        let handler = &*self.handler;
        let context = control.context();
        let handled = AssertUnwindSafe(context.scope(async move { handler.handle(job).await }))
            .catch_unwind()
            .instrument(span.clone());
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let timed_out = || {
            let after = self.timeout.unwrap_or_default();
            format!("handler timed out after {after:?}")
        };

        let started = Instant::now();
        let settle = tokio::select! {
            biased;
            // The lease is lost: the handler is dropped without being polled again, so
            // it cannot run on through an `.await` that is already ready (its outcome
            // could not be stored anyway). No outcome; the slot frees and the keeper
            // hears the job ended as the guards drop.
            () = control.stop.notified() => return,
            // A handler that returned wins over a deadline or shutdown seen in the same
            // poll: its work is done, and releasing the job would run it again.
            res = handled => match res {
                // Succeeded past its timeout, seen only now: it blocked its thread, or
                // its task ran late.
                Ok(Ok(_)) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    Settle::fail(lease, timed_out(), Retry::Backoff)
                }
                Ok(Ok(done)) => Settle::complete(lease).with_output(done.output),
                Ok(Err(e)) => handler_failure(lease, e.message, e.retry),
                Err(panic) => {
                    Settle::fail(lease, format!("handler panicked: {}", panic_text(&*panic)), Retry::Backoff)
                }
            },
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                control.token.cancel();
                Settle::fail(lease, timed_out(), Retry::Backoff)
            }
            () = self.abort.cancelled() => {
                control.token.cancel();
                Settle::release(lease)
            }
        };
        control.handed.store(true, Ordering::SeqCst);
        let outcome = match &settle.outcome {
            Outcome::Complete => "succeeded",
            Outcome::Fail { .. } => "failed",
            Outcome::Release => "released",
        };
        metrics::histogram!("relayq_worker_handler_seconds", "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        span.in_scope(|| tracing::debug!(outcome = ?settle.outcome, "job done"));
        // The guard goes along: the settler drops it once done with the outcome. If the
        // send fails (the settler panicked), it drops here.
        let _ = self.settle.send((settle, ended)).await;
        // Freed once the outcome is with the settler, so a worker with no busy slot has
        // no outcome on its way (the settler's dry flush counts on that), and one
        // whose settler falls behind stops taking jobs it could not settle.
        drop(slot);
    }
}

/// Marks a job's run finished when dropped, however it ends.
struct Finished<'a>(&'a Control);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::SeqCst);
    }
}

/// Tells the keeper, when dropped, that a job ended, so that it stops heartbeating the
/// lease. It lives with the job on its slot until the outcome goes to the settler,
/// then with the outcome until it is stored or given up on; a job stopped or dropped
/// (lease lost, worker dropped) or a settler that panics drops it on the way. So each
/// started job ends exactly once.
pub(super) struct Ended {
    keeper: mpsc::UnboundedSender<keeper::Msg>,
    job: JobId,
    token: LeaseToken,
}

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.keeper.send(keeper::Msg::Ended(self.job, self.token));
    }
}

/// The failure a handler returned. A retry time the backends would refuse (over 100
/// years away, or outside 1970–9999) would fail the whole settle call, and with it the
/// outcomes batched beside this one; the job retries on the default backoff instead,
/// and its error says why.
fn handler_failure(lease: Lease, message: String, retry: Retry) -> Settle {
    match validate::retry(retry) {
        Ok(()) => Settle::fail(lease, message, retry),
        Err(e) => {
            tracing::warn!(queue = %lease.queue, id = %lease.job, error = %e, "handler asked for a retry time out of range; the default backoff is used");
            let message = format!("{message} (retry time refused: {e}; default backoff used)");
            Settle::fail(lease, message, Retry::Backoff)
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
