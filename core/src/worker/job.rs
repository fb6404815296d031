//! One job's life inside a worker: run the handler, catching a panic and stopping it at
//! its timeout or the shutdown deadline, then hand the outcome to the settler (SPEC W1,
//! W3, W4). Its lease is heartbeated meanwhile by the [keeper](super::keeper), which
//! aborts this task if the lease is lost.
//!
//! The handler runs in the job's own task, so its timeout and the shutdown deadline
//! stop it at an `.await`: a handler that blocks its thread is stopped once it yields,
//! and one that returns past its timeout is failed all the same.
//!
//! The slot frees as soon as the outcome is handed to the settler (at once, unless
//! the settler is behind); the keeper goes on heartbeating the lease until the settler
//! has stored the outcome.

use std::{
    any::Any,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use tokio::{
    sync::{Notify, mpsc},
    time::{Instant, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Handler, keeper};
use crate::{ClaimedJob, JobId, Lease, LeaseToken, Retry, Settle, validate};

/// An outcome for the settler, with the guard that tells the keeper the job ended once
/// the settler is done with it (stored, given up on, or dropped in a panic).
pub(super) type Settling = (Settle, Ended);

pub(super) struct JobRun {
    pub(super) handler: Arc<dyn Handler>,
    /// Told when the job ends (through its [`Ended`] guard).
    pub(super) keeper: mpsc::UnboundedSender<keeper::Msg>,
    pub(super) timeout: Option<Duration>,
    /// Cancelled when the shutdown deadline passes: the job is released.
    pub(super) abort: CancellationToken,
    pub(super) settle: mpsc::Sender<Settling>,
    pub(super) slots: Slots,
}

/// Busy slots of a worker, and a wake-up for the claim loop when one frees.
#[derive(Clone, Default)]
pub(super) struct Slots {
    pub(super) busy: Arc<AtomicU32>,
    pub(super) freed: Arc<Notify>,
}

/// Holds one slot; frees it when dropped, however the job ends.
struct Slot(Slots);

impl Slots {
    fn take(&self) -> Slot {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Slot(self.clone())
    }

    pub(super) fn busy(&self) -> u32 {
        self.busy.load(Ordering::SeqCst)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.freed.notify_one();
    }
}

impl JobRun {
    /// Takes a slot now (so the claim loop counts it at once) and returns the job's
    /// future, to be spawned as its task. The job's [`Ended`] guard is made here too, so
    /// that the keeper hears of a task dropped before it first ran.
    ///
    /// `handed` is set once the handler's outcome is decided and on its way to the
    /// settler: the keeper no longer stops the task then.
    pub(super) fn start(
        self,
        job: ClaimedJob,
        handed: Arc<AtomicBool>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let slot = self.slots.take();
        let ended = Ended {
            keeper: self.keeper.clone(),
            job: job.lease.job,
            token: job.lease.token,
        };
        self.run(job, slot, ended, handed)
    }

    async fn run(self, job: ClaimedJob, slot: Slot, ended: Ended, handed: Arc<AtomicBool>) {
        let lease = job.lease.clone();
        let span = tracing::info_span!("relayq.job", queue = %lease.queue, id = %lease.job, attempt = lease.attempt);
        // Dropping this future (timeout, shutdown, or the keeper aborting the task) stops
        // the handler; `async` so that a panic in `handle` itself is caught too.
        let handler = self.handler.clone();
        let handled = AssertUnwindSafe(async move { handler.handle(job).await })
            .catch_unwind()
            .instrument(span.clone());
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let timed_out = || {
            let after = self.timeout.unwrap_or_default();
            format!("handler timed out after {after:?}")
        };

        let settle = tokio::select! {
            // A handler that returned wins over a deadline or shutdown seen in the same
            // poll: its work is done, and releasing the job would run it again.
            biased;
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
                Settle::fail(lease, timed_out(), Retry::Backoff)
            }
            () = self.abort.cancelled() => Settle::release(lease),
        };
        handed.store(true, Ordering::SeqCst);
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

/// Tells the keeper, when dropped, that a job ended, so that it stops heartbeating the
/// lease. It lives in the job's task until the outcome goes to the settler, then with
/// the outcome until it is stored or given up on; a task aborted or dropped (lease
/// lost, worker dropped) or a settler that panics drops it on the way. So each started
/// job ends exactly once.
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
