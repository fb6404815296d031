//! Settles finished jobs in batches through `settle_many` (SPEC W1, L6).
//!
//! One commit per job caps a database backend at a fraction of what batching reaches,
//! so outcomes are collected until `max_batch` wait or `delay` passes, then sent in one
//! call. Backend errors are retried a few times; if they persist the leases simply
//! expire and the jobs are claimed again (SPEC X3): nothing is lost.
//!
//! Up to [`IN_FLIGHT`] calls run at once: a database settle waits for its commit to
//! reach the disk, and one call at a time would cap a worker at one batch per fsync.
//!
//! The delay is not waited out when the worker runs dry (see [`Runner`]'s `dry`
//! signal): no outcome is coming to join the batch then, and the queue may be waiting
//! for these ones (a group's next job, a batch's next stage, a caller's `wait`).
//!
//! [`Runner`]: super::run::Runner

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::FutureExt;

use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
    time::{Instant, sleep_until},
};

use super::{control::Settling, stats::Stats};
use crate::{Backend, Error, Outcome, Settle, Settled, retry::Policy};

/// Settle calls a worker has in flight at most.
const IN_FLIGHT: usize = 4;

#[derive(Clone)]
pub(super) struct Settler {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) max_batch: usize,
    pub(super) delay: Duration,
    pub(super) stats: Arc<Stats>,
    /// True while the worker has run dry: nothing running or buffered, its last claim
    /// short.
    pub(super) dry: watch::Receiver<bool>,
}

/// How a worker retries a settle call that failed on a transient error.
const SETTLE: Policy = Policy {
    min_delay: Duration::from_millis(10),
    max_delay: Duration::from_secs(1),
    max_retries: Some(5),
    jitter: true,
};

/// `settle_many`, retried a few times with backoff on transient backend errors (a lost
/// connection, a deadlock victim, a busy server: [`Error::is_transient`]); any other
/// error would fail again and is returned at once. A backend that panics fails the
/// call, not the worker.
pub(super) async fn settle_retrying(
    backend: &dyn Backend,
    batch: &[Settle],
) -> crate::Result<Vec<crate::Result<Settled>>> {
    let attempt = || {
        AssertUnwindSafe(backend.settle_many(batch.to_vec()))
            .catch_unwind()
            .map(|r| r.unwrap_or_else(|_| Err(Error::backend("settle_many panicked"))))
    };
    // A backend that already retried its own transaction reports the error as
    // persistent, not transient, so these tries do not multiply the backend's.
    SETTLE.run(attempt, Error::is_transient).await
}

impl Settler {
    pub(super) async fn run(self, mut rx: mpsc::Receiver<Settling>) {
        let mut flushing = JoinSet::new();
        let mut dry = self.dry.clone();
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let deadline = Instant::now() + self.delay;
            while batch.len() < self.max_batch {
                tokio::select! {
                    // Outcomes already sent come first.
                    biased;
                    got = rx.recv() => match got {
                        Some(s) => batch.push(s),
                        None => break,
                    },
                    // Dry (or the worker gone): nothing more is coming but what was
                    // sent since the first arm looked (a job sends before its slot
                    // frees, and the worker is dry only with every slot free).
                    _ = dry.wait_for(|&dry| dry) => {
                        while batch.len() < self.max_batch && let Ok(s) = rx.try_recv() {
                            batch.push(s);
                        }
                        break;
                    }
                    () = sleep_until(deadline) => break,
                }
            }
            while flushing.len() >= IN_FLIGHT {
                flushing.join_next().await;
            }
            let me = self.clone();
            flushing.spawn(async move { me.flush(batch).await });
        }
        while flushing.join_next().await.is_some() {}
    }

    /// Settles `batch`, then drops the jobs' guards, which stops their heartbeats: the
    /// outcomes are stored or given up on.
    async fn flush(&self, batch: Vec<Settling>) {
        let (batch, _ended): (Vec<Settle>, Vec<_>) = batch.into_iter().unzip();
        let n = batch.len();
        match settle_retrying(&*self.backend, &batch).await {
            Ok(results) => {
                self.stats.outage.succeeded();
                for (settle, result) in batch.iter().zip(results) {
                    self.record(settle, &result);
                }
            }
            // Refused as a whole for one bad outcome: the others are settled one by one,
            // so only that one is lost (its lease expires, and the job runs again).
            Err(Error::InvalidInput { .. }) if n > 1 => {
                for settle in batch {
                    let result = settle_retrying(&*self.backend, std::slice::from_ref(&settle))
                        .await
                        .and_then(|mut r| {
                            r.pop().unwrap_or_else(|| Err(Error::backend("no result")))
                        });
                    self.record(&settle, &result);
                }
            }
            Err(e) => {
                if matches!(e, Error::Backend { .. }) {
                    self.stats.outage.failed("settle", "settle", &e);
                }
                self.stats.add_lost(n, "backend_down");
                tracing::error!(error = %e, jobs = n, "could not settle; their leases will expire and the jobs run again");
            }
        }
    }

    fn record(&self, settle: &Settle, result: &crate::Result<Settled>) {
        let lease = &settle.lease;
        match result {
            Ok(Settled::Completed) => self.stats.add_succeeded(&lease.queue),
            Ok(Settled::Retrying { .. } | Settled::Dead) => self.stats.add_failed(&lease.queue),
            Ok(Settled::Released) => self.stats.add_released(&lease.queue, 1),
            Err(e) => {
                self.stats.add_lost(1, "refused");
                let outcome = match settle.outcome {
                    Outcome::Complete => "complete",
                    Outcome::Fail { .. } => "fail",
                    Outcome::Release => "release",
                };
                tracing::warn!(queue = %lease.queue, job = %lease.job, attempt = lease.attempt, outcome, error = %e, "settle refused");
            }
        }
    }
}
