//! One slot held for one job, and the counts of busy and idle slots the claim loop
//! reads: a leaf module, so that a job can hold its slot without the job module and
//! the pool's module ([`super::slots`]) depending on each other.

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicU32, Ordering},
};

use tokio::sync::Notify;

/// What the slots share with the claim loop: how many are busy, which are idle, and a
/// wake-up for the loop when one frees.
pub(super) struct Shared {
    /// The worker's name: the `worker` label of the busy-slots gauge.
    worker: String,
    busy: AtomicU32,
    idle: Mutex<Vec<usize>>,
    pub(super) freed: Notify,
}

impl Shared {
    /// `n` idle slots.
    pub(super) fn new(n: usize, worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            busy: AtomicU32::new(0),
            // Popped from the end: the first slots are used first.
            idle: Mutex::new((0..n).rev().collect()),
            freed: Notify::new(),
        }
    }

    pub(super) fn busy(&self) -> u32 {
        self.busy.load(Ordering::SeqCst)
    }

    /// Takes an idle slot, counted busy at once; `None` when every slot is busy.
    pub(super) fn take(self: &Arc<Self>) -> Option<Slot> {
        let index = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        self.busy.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!("relayq_worker_busy_slots", "worker" => self.worker.clone()).increment(1.0);
        Some(Slot {
            shared: self.clone(),
            index,
        })
    }
}

/// Holds one slot for one job; frees it when dropped, however the job ends.
pub(super) struct Slot {
    shared: Arc<Shared>,
    index: usize,
}

impl Slot {
    /// Which slot: the index of its task's mailbox.
    pub(super) fn index(&self) -> usize {
        self.index
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Idle before it counts as free: the loop takes an idle slot for every free one.
        self.shared
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
        self.shared.busy.fetch_sub(1, Ordering::SeqCst);
        metrics::gauge!("relayq_worker_busy_slots", "worker" => self.shared.worker.clone())
            .decrement(1.0);
        self.shared.freed.notify_one();
    }
}
