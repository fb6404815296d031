//! Counters a worker reports when it stops, and the state of its server as its calls
//! see it.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering::Relaxed},
};

use super::outage::Outage;

/// What a worker did, reported when it stops.
///
/// Every claimed job ends in exactly one of the five outcome counters, so
/// `succeeded + failed + released + lease_lost + lost == claimed` once the worker has
/// stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerReport {
    /// Jobs claimed.
    pub claimed: u64,
    /// Jobs completed.
    pub succeeded: u64,
    /// Attempts failed (the job retries or is dead).
    pub failed: u64,
    /// Jobs released (shutdown, or held too long in the prefetch buffer).
    pub released: u64,
    /// Jobs whose handler the worker stopped because their lease was lost (cancelled,
    /// taken over) or ran out with no heartbeat through: no outcome was sent; the
    /// server decides what happens to the job (it runs again, unless cancelled).
    pub lease_lost: u64,
    /// Outcomes the backend refused (stale lease) or could not take (backend down), and
    /// jobs whose run ended with no outcome for another reason (a worker dropped
    /// mid-run): not settled; their leases expire and the jobs run again.
    pub lost: u64,
}

impl WorkerReport {
    /// The sum of the outcome counters; equal to `claimed` once the worker stopped.
    #[must_use]
    pub fn ended(&self) -> u64 {
        self.succeeded + self.failed + self.released + self.lease_lost + self.lost
    }
}

/// Each counter also goes to the `metrics` facade (a no-op until the program installs a
/// recorder), process-wide and without labels beyond the outcome:
/// `relayq_worker_claimed_total`, `relayq_worker_settled_total{outcome}` (succeeded,
/// failed, released), `relayq_worker_lease_lost_total` and
/// `relayq_worker_unsettled_total{reason}` (the report's `lost`: refused or untaken
/// settles), `relayq_worker_backend_errors_total{op,kind}` (failed claims, heartbeats
/// and settles by [`ErrorKind`](crate::ErrorKind)).
/// Beside them: `relayq_worker_busy_slots` (gauge), `relayq_worker_handler_seconds{outcome}`
/// (histogram: how long each handler ran, to its outcome), and the maintenance pass's
/// `relayq_maintenance_pruned_total` and `relayq_maintenance_requeued_total`.
#[derive(Debug, Default)]
pub(super) struct Stats {
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
    lost: AtomicU64,
    /// Whether the server answers: one warning per outage (claims, beats, settles).
    pub(super) outage: Arc<Outage>,
}

impl Stats {
    pub(super) fn add_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Relaxed);
        metrics::counter!("relayq_worker_claimed_total").increment(n as u64);
    }
    pub(super) fn add_succeeded(&self) {
        self.succeeded.fetch_add(1, Relaxed);
        metrics::counter!("relayq_worker_settled_total", "outcome" => "succeeded").increment(1);
    }
    pub(super) fn add_failed(&self) {
        self.failed.fetch_add(1, Relaxed);
        metrics::counter!("relayq_worker_settled_total", "outcome" => "failed").increment(1);
    }
    pub(super) fn add_released(&self, n: usize) {
        self.released.fetch_add(n as u64, Relaxed);
        metrics::counter!("relayq_worker_settled_total", "outcome" => "released")
            .increment(n as u64);
    }
    pub(super) fn add_lease_lost(&self) {
        self.lease_lost.fetch_add(1, Relaxed);
        metrics::counter!("relayq_worker_lease_lost_total").increment(1);
    }
    /// `reason`: `refused` (the backend refused the outcome: a stale lease),
    /// `backend_down` (the settle call failed), `release_failed`, or `no_outcome` (a
    /// run that ended without one).
    pub(super) fn add_lost(&self, n: usize, reason: &'static str) {
        self.lost.fetch_add(n as u64, Relaxed);
        metrics::counter!("relayq_worker_unsettled_total", "reason" => reason).increment(n as u64);
    }
    pub(super) fn report(&self) -> WorkerReport {
        WorkerReport {
            claimed: self.claimed.load(Relaxed),
            succeeded: self.succeeded.load(Relaxed),
            failed: self.failed.load(Relaxed),
            released: self.released.load(Relaxed),
            lease_lost: self.lease_lost.load(Relaxed),
            lost: self.lost.load(Relaxed),
        }
    }
}
