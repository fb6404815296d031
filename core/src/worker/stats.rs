//! Counters a worker reports when it stops.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a worker did, reported when it stops.
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
    /// Outcomes the backend refused (stale lease) or could not take (backend down).
    pub lost: u64,
}

#[derive(Debug, Default)]
pub(super) struct Stats {
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
}

impl Stats {
    pub(super) fn add_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Relaxed);
    }
    pub(super) fn add_succeeded(&self) {
        self.succeeded.fetch_add(1, Relaxed);
    }
    pub(super) fn add_failed(&self) {
        self.failed.fetch_add(1, Relaxed);
    }
    pub(super) fn add_released(&self, n: usize) {
        self.released.fetch_add(n as u64, Relaxed);
    }
    pub(super) fn add_lost(&self, n: usize) {
        self.lost.fetch_add(n as u64, Relaxed);
    }
    pub(super) fn report(&self) -> WorkerReport {
        WorkerReport {
            claimed: self.claimed.load(Relaxed),
            succeeded: self.succeeded.load(Relaxed),
            failed: self.failed.load(Relaxed),
            released: self.released.load(Relaxed),
            lost: self.lost.load(Relaxed),
        }
    }
}
