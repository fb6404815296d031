//! The worker's beat (SPEC M9): every few seconds, for each queue it serves, what it is
//! (name, host, slots) and how busy (slots running a handler, jobs held in its buffer),
//! so an operator sees who serves a queue, and a queue that nobody serves.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use chrono::{DateTime, Utc};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::slot::Shared;
use crate::{
    Backend, WorkerBeat,
    workers::{BEAT_EVERY, host_name},
};

pub(super) struct Beater {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) queues: Arc<[String]>,
    pub(super) worker: String,
    /// How many slots it has, and how many are busy.
    pub(super) slots: u32,
    pub(super) shared: Arc<Shared>,
    /// Jobs of each queue (in `queues`' order) held in the buffer.
    pub(super) held: Arc<[AtomicU32]>,
    pub(super) started_at: DateTime<Utc>,
}

impl Beater {
    /// Beats at once, then every [`BEAT_EVERY`], until `stop` fires. A failed beat is
    /// logged and the next one tries again: it says who serves, nothing depends on it.
    pub(super) async fn run(self, stop: CancellationToken) {
        let host = host_name();
        loop {
            let beat = WorkerBeat {
                worker: self.worker.clone(),
                host: host.clone(),
                pid: std::process::id(),
                // Up to the most a beat names; every queue is still beaten for.
                queues: self
                    .queues
                    .iter()
                    .take(crate::workers::MAX_BEAT_QUEUES)
                    .cloned()
                    .collect(),
                slots: self.slots,
                busy: self.shared.busy(),
                held: 0,
                started_at: self.started_at,
            };
            for (queue, held) in self.queues.iter().zip(self.held.iter()) {
                // Each queue hears of its own jobs held in the buffer.
                let beat = WorkerBeat {
                    held: held.load(Ordering::Relaxed),
                    ..beat.clone()
                };
                // On a task of its own: a backend call is never dropped midway (see the
                // keeper); stopping only stops waiting for it.
                let (backend, queue) = (self.backend.clone(), queue.clone());
                let call = tokio::spawn(async move { backend.worker_beat(&queue, &beat).await });
                tokio::select! {
                    done = call => {
                        if let Ok(Err(e)) = done {
                            tracing::debug!(worker = %self.worker, error = %e, "worker beat failed");
                        }
                    }
                    () = stop.cancelled() => return,
                }
            }
            tokio::select! {
                () = sleep(BEAT_EVERY) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}
