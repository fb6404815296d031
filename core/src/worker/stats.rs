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
/// recorder), summed over the process's workers: see [`METRICS`] for the series.
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// The worker's name: the `worker` label of its series.
    worker: String,
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
    lost: AtomicU64,
    /// Whether the server answers: one warning per outage (claims, beats, settles).
    pub(super) outage: Arc<Outage>,
}

fn settled(worker: &str, queue: &str, outcome: &'static str, n: usize) {
    metrics::counter!("relayq_worker_settled_total", "queue" => queue.to_owned(), "outcome" => outcome, "worker" => worker.to_owned())
        .increment(n as u64);
}

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observed values.
    Histogram,
}

/// The worker's series: name, kind, help text. The help texts reach the recorder with
/// [`describe_metrics`].
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "relayq_worker_claimed_total",
        Kind::Counter,
        "Jobs claimed, by queue.",
    ),
    (
        "relayq_worker_settled_total",
        Kind::Counter,
        "Attempts settled, by queue and outcome (succeeded, failed, released).",
    ),
    (
        "relayq_worker_lease_lost_total",
        Kind::Counter,
        "Handlers stopped because their lease was lost (cancelled, taken over, or ran out), by queue.",
    ),
    (
        "relayq_worker_unsettled_total",
        Kind::Counter,
        "Outcomes the backend refused or could not take, by reason; those jobs run again after their lease.",
    ),
    (
        "relayq_worker_backend_errors_total",
        Kind::Counter,
        "Failed backend calls of the worker, by operation and error kind.",
    ),
    (
        "relayq_worker_busy_slots",
        Kind::Gauge,
        "Slots running a handler now.",
    ),
    (
        "relayq_worker_handler_seconds",
        Kind::Histogram,
        "How long each handler ran, by queue and outcome.",
    ),
    (
        "relayq_maintenance_pruned_total",
        Kind::Counter,
        "Finished jobs pruned by maintenance passes.",
    ),
    (
        "relayq_maintenance_requeued_total",
        Kind::Counter,
        "Jobs whose lease had expired, requeued by maintenance passes.",
    ),
];

/// Gives the installed recorder the help text of each of the worker's series (the
/// `# HELP` lines of Prometheus text). Call it once after installing a recorder.
pub fn describe_metrics() {
    for &(name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
}

impl Stats {
    /// The counts of the worker named `worker`, all zero.
    pub(super) fn new(worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            outage: Arc::new(Outage::new(worker)),
            ..Self::default()
        }
    }
    pub(super) fn add_claimed(&self, queue: &str, n: usize) {
        self.claimed.fetch_add(n as u64, Relaxed);
        metrics::counter!("relayq_worker_claimed_total", "queue" => queue.to_owned(), "worker" => self.worker.clone())
            .increment(n as u64);
    }
    pub(super) fn add_succeeded(&self, queue: &str) {
        self.succeeded.fetch_add(1, Relaxed);
        settled(&self.worker, queue, "succeeded", 1);
    }
    pub(super) fn add_failed(&self, queue: &str) {
        self.failed.fetch_add(1, Relaxed);
        settled(&self.worker, queue, "failed", 1);
    }
    pub(super) fn add_released(&self, queue: &str, n: usize) {
        self.released.fetch_add(n as u64, Relaxed);
        settled(&self.worker, queue, "released", n);
    }
    pub(super) fn add_lease_lost(&self, queue: &str) {
        self.lease_lost.fetch_add(1, Relaxed);
        metrics::counter!("relayq_worker_lease_lost_total", "queue" => queue.to_owned(), "worker" => self.worker.clone())
            .increment(1);
    }
    /// `reason`: `refused` (the backend refused the outcome: a stale lease),
    /// `backend_down` (the settle call failed), `release_failed`, or `no_outcome` (a
    /// run that ended without one).
    pub(super) fn add_lost(&self, n: usize, reason: &'static str) {
        self.lost.fetch_add(n as u64, Relaxed);
        metrics::counter!("relayq_worker_unsettled_total", "reason" => reason, "worker" => self.worker.clone())
            .increment(n as u64);
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
