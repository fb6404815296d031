//! One job's life inside a worker: run the handler in its own task (so a panic is
//! caught and a timeout can abort it), heartbeat the lease from the job's task meanwhile,
//! and hand the outcome to the settler (SPEC W1, W3, W4).
//!
//! The slot frees as soon as the handler returns, but the lease is heartbeated until
//! the settler has stored the outcome: a slow settle must not let a finished job's
//! lease expire and the job run again.

use std::{
    any::Any,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::{
    sync::{Notify, mpsc, oneshot},
    time::{Instant, MissedTickBehavior, interval_at, sleep_until},
};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::Instrument;

use super::Handler;
use crate::{Backend, ClaimedJob, Error, Lease, Retry, Settle};

/// An outcome for the settler, and where to say it was stored.
pub(super) type Settling = (Settle, oneshot::Sender<()>);

pub(super) struct JobRun {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) lease_length: Duration,
    pub(super) heartbeat_every: Duration,
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
    /// future. Heartbeats are timed from `claimed_at`, when the lease was taken: a job
    /// that waited in the prefetch buffer is renewed on the same schedule as any other.
    pub(super) fn start(
        self,
        job: ClaimedJob,
        claimed_at: Instant,
    ) -> impl Future<Output = ()> + Send + 'static {
        let slot = self.slots.take();
        self.run(job, claimed_at, slot)
    }

    async fn run(self, job: ClaimedJob, claimed_at: Instant, slot: Slot) {
        let lease = job.lease.clone();
        let span = tracing::info_span!("relayq.job", queue = %lease.queue, id = %lease.job, attempt = lease.attempt);
        let handler = self.handler.clone();
        // Aborted when dropped: a handler never outlives its job's task. It runs in a task
        // of its own so that one blocking its thread cannot stall the heartbeats below.
        let mut task = AbortOnDropHandle::new(tokio::spawn(
            async move { handler.handle(job).await }.instrument(span.clone()),
        ));
        // Heartbeats run in this task, which otherwise only waits: a task fewer per job.
        // The future ends only when the lease is lost.
        let beat = heartbeat(
            self.backend.clone(),
            lease.clone(),
            self.lease_length,
            claimed_at + self.heartbeat_every,
            self.heartbeat_every,
        );
        let mut beat = pin!(beat.instrument(span.clone()));
        let deadline = self.timeout.map(|t| Instant::now() + t);

        let settle = tokio::select! {
            res = &mut task => match res {
                Ok(Ok(done)) => Settle::complete(lease).with_output(done.output),
                Ok(Err(e)) => Settle::fail(lease, e.message, e.retry),
                Err(e) if e.is_panic() => {
                    Settle::fail(lease, format!("handler panicked: {}", panic_text(&*e.into_panic())), Retry::Backoff)
                }
                Err(_) => Settle::release(lease),
            },
            () = &mut beat => {
                // Cancelled, or expired and taken over: someone else owns it now.
                span.in_scope(|| tracing::warn!("lease lost while running; handler stopped"));
                return;
            }
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                let after = self.timeout.unwrap_or_default();
                Settle::fail(lease, format!("handler timed out after {after:?}"), Retry::Backoff)
            }
            () = self.abort.cancelled() => Settle::release(lease),
        };
        // Stop the handler if it is still running (timeout, shutdown) and free the slot.
        drop(task);
        drop(slot);
        span.in_scope(|| tracing::debug!(outcome = ?settle.outcome, "job done"));
        // Heartbeats go on until the outcome is stored (or given up on); a lease lost
        // meanwhile ends the wait, as the outcome can no longer be stored.
        let (stored, acked) = oneshot::channel();
        tokio::select! {
            sent = self.settle.send((settle, stored)) => {
                if sent.is_ok() {
                    tokio::select! {
                        _ = acked => {}
                        () = &mut beat => {}
                    }
                }
            }
            () = &mut beat => {}
        }
    }
}

/// Extends the lease at `first` and every `every` after; returns once the lease is
/// lost. Transient errors are logged and retried at the next beat.
async fn heartbeat(
    backend: Arc<dyn Backend>,
    lease: Lease,
    length: Duration,
    first: Instant,
    every: Duration,
) {
    let mut beat = interval_at(first, every);
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        beat.tick().await;
        match backend.heartbeat(&lease, length).await {
            Ok(_) => {}
            Err(Error::StaleLease) => return,
            Err(e) => tracing::warn!(error = %e, "heartbeat failed; will retry"),
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
