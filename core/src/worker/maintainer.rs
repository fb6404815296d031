//! The maintenance timer (SPEC M3): every so often, a maintenance pass over each
//! served queue, so finished jobs past their retention are pruned and expired leases
//! recovered without anyone calling [`maintain`](crate::Admin::maintain).
//!
//! Every worker runs the timer; [`try_maintain`](crate::Admin::try_maintain) takes the
//! backend's lock, so of many workers serving a queue one runs a pass at a time and the
//! others skip it. The first pass comes after a random part of the interval, so workers
//! started together do not all try at once.

use std::{sync::Arc, time::Duration};

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::Backend;

/// When and what the timer prunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Schedule {
    /// Time between passes.
    pub(super) every: Duration,
    /// Finished jobs older than this are deleted.
    pub(super) retention: Duration,
}

#[derive(Clone)]
pub(super) struct Maintainer {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) queues: Arc<[String]>,
    pub(super) schedule: Schedule,
    pub(super) worker: String,
}

impl Maintainer {
    /// Runs passes until `stop` fires. A pass in progress is dropped then: each of its
    /// statements is atomic, and the lock is released with its connection or expires.
    pub(super) async fn run(self, stop: CancellationToken) {
        let first = self.schedule.every.mul_f64(fastrand::f64());
        let mut wait = first;
        loop {
            tokio::select! {
                () = sleep(wait) => {}
                () = stop.cancelled() => return,
            }
            // A pass runs on a task of its own and is not cancelled when the worker
            // stops: dropping a backend call midway can leave its connection inside a
            // transaction (see the keeper). Stopping only stops waiting for it.
            let me = self.clone();
            let pass = tokio::spawn(async move { me.pass().await });
            tokio::select! {
                _ = pass => {}
                () = stop.cancelled() => return,
            }
            // ±10% so that workers drift apart rather than meet at every tick.
            wait = self.schedule.every.mul_f64(0.9 + fastrand::f64() * 0.2);
        }
    }

    async fn pass(&self) {
        for queue in self.queues.iter() {
            match self
                .backend
                .try_maintain(queue, self.schedule.retention)
                .await
            {
                Ok(Some(m)) => {
                    metrics::counter!("relayq_maintenance_pruned_total").increment(m.pruned);
                    metrics::counter!("relayq_maintenance_requeued_total")
                        .increment(m.requeued + m.dead);
                    tracing::debug!(worker = %self.worker, queue, ?m, "maintenance pass");
                }
                Ok(None) => {
                    tracing::debug!(worker = %self.worker, queue, "maintenance: another pass runs");
                }
                // The claim loop reports outages; a pass that failed is tried at the next
                // tick, and only a failure that is not an outage is worth a warning.
                Err(e) if e.is_transient() => {
                    tracing::debug!(worker = %self.worker, queue, error = %e, "maintenance failed");
                }
                Err(e) => {
                    tracing::warn!(worker = %self.worker, queue, error = %e, "maintenance failed");
                }
            }
        }
    }
}
