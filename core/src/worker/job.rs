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
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use futures::FutureExt;
use tokio::{
    sync::mpsc,
    time::{Instant, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    Handler,
    control::{Control, Ended, Settling},
    slot::Slot,
};
use crate::{ClaimedJob, Error, Lease, Outcome, Retry, Settle, validate};

/// What a slot's jobs share: the handler and where their outcomes go.
#[derive(Clone)]
pub(super) struct JobRun {
    pub(super) handler: Arc<dyn Handler>,
    pub(super) timeout: Option<Duration>,
    /// Cancelled when the shutdown deadline passes: the job is released.
    pub(super) abort: CancellationToken,
    pub(super) settle: mpsc::Sender<Settling>,
    /// The largest result a handler may leave (SPEC L8).
    pub(super) max_result: usize,
}

/// A job handed to a slot, with its guards.
pub(super) struct Assigned {
    pub(super) job: ClaimedJob,
    /// The last moment its handler may start: when the keeper would stop it, the lease
    /// less its margin, reckoned from the claim. A worker frozen
    /// (SIGSTOP, a paused VM) between handing a job to its slot and the slot running it
    /// finds it past this when it thaws, perhaps with the lease long gone and the job
    /// run elsewhere: it is stopped instead of started.
    pub(super) start_by: Instant,
    /// When its claim was sent: the handler's start, less this, is how long it waited
    /// in the buffer, which its settle reports (SPEC L5).
    pub(super) claimed_at: Instant,
    pub(super) control: Arc<Control>,
    pub(super) slot: Slot,
    pub(super) ended: Ended,
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
            start_by,
            claimed_at,
        } = assigned;
        let _finished = Finished(&control);
        // Its lease was lost while it waited for this slot.
        if control.stopped.load(Ordering::SeqCst) {
            return;
        }
        // Too late to start (the worker was frozen): counted as a lease lost, and the
        // job runs again once its lease expires.
        if Instant::now() >= start_by {
            tracing::warn!(queue = %job.lease.queue, id = %job.lease.job, attempt = job.lease.attempt, "job reached its slot too late to start (was the worker frozen?); not started");
            control.stop();
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
                Ok(Ok(done)) => succeeded(lease, done.output, self.max_result),
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
        // Time in the buffer, reported so the log starts the attempt when its handler
        // did (SPEC L5). Under 10 ms it is left out: a fast drain's jobs wait a few
        // milliseconds each, and carrying that cost Redis's drain about 7% (a field
        // per job) for a difference no timeline shows.
        let waited = started.saturating_duration_since(claimed_at);
        let settle = if waited >= WAIT_WORTH_LOGGING {
            settle.with_waited(waited)
        } else {
            settle
        };
        let outcome = match &settle.outcome {
            Outcome::Complete => "succeeded",
            Outcome::Fail { .. } => "failed",
            Outcome::Release => "released",
        };
        metrics::histogram!("relayq_worker_handler_seconds", "queue" => settle.lease.queue.clone(), "outcome" => outcome, "worker" => settle.lease.worker.clone())
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

/// The least wait in the buffer a settle reports (SPEC L5).
const WAIT_WORTH_LOGGING: Duration = Duration::from_millis(10);

/// Marks a job's run finished when dropped, however it ends.
struct Finished<'a>(&'a Control);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::SeqCst);
    }
}

/// A handler's success, with its result; a result over the bound fails the job for
/// good, saying so, since the same run would leave the same result again (SPEC L8).
fn succeeded(lease: Lease, result: Option<String>, max: usize) -> Settle {
    match result {
        Some(r) if r.len() > max => {
            let e = Error::invalid("result", format!("at most {max} bytes, got {}", r.len()));
            tracing::warn!(queue = %lease.queue, id = %lease.job, error = %e, "handler left a result over the bound; the job fails");
            Settle::fail(lease, e.to_string(), Retry::Never)
        }
        output => Settle::complete(lease).with_output(output),
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
