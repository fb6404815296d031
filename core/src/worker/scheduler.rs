//! The scheduler (SPEC S5): every worker fires the due slots of its queues' schedules.
//!
//! No leader: each slot is fired by the backend's atomic step, which only the first
//! scheduler to ask wins (SPEC S2), so any number of workers can run this. A pass is
//! one read of each queue's schedules; the next comes at the next slot, or after a
//! second at most, so a schedule added or resumed elsewhere is seen within one.

use std::{sync::Arc, time::Duration};

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::{
    Backend,
    schedule::{Memo, run_due_with},
};

/// Longest time between two passes.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// Shortest: a slot's time read from another clock may still lie a hair ahead.
const MIN_WAIT: Duration = Duration::from_millis(5);

#[derive(Clone)]
pub(super) struct Scheduler {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) queues: Arc<[String]>,
    pub(super) worker: String,
}

impl Scheduler {
    /// Runs passes until `stop` fires.
    pub(super) async fn run(self, stop: CancellationToken) {
        let mut memo = Memo::default();
        loop {
            // A pass runs on a task of its own and is not cancelled when the worker
            // stops: dropping a fire midway could leave its connection inside a
            // transaction. Stopping only stops waiting for it. The pass takes the memo
            // and hands it back; a pass that panicked leaves a fresh one.
            let me = self.clone();
            let pass = tokio::spawn(async move { me.pass(memo).await });
            let wait = tokio::select! {
                done = pass => match done {
                    Ok((wait, kept)) => {
                        memo = kept;
                        wait
                    }
                    Err(_) => {
                        memo = Memo::default();
                        MAX_WAIT
                    }
                },
                () = stop.cancelled() => return,
            };
            tokio::select! {
                () = sleep(wait.max(MIN_WAIT)) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// One pass over every queue; returns how long to wait before the next, and the
    /// memo.
    async fn pass(&self, mut memo: Memo) -> (Duration, Memo) {
        let mut wait = MAX_WAIT;
        for queue in self.queues.iter() {
            match run_due_with(&*self.backend, queue, &mut memo).await {
                Ok(tick) => {
                    for (name, slot, _) in &tick.fired {
                        metrics::counter!("relayq_schedule_slots_total").increment(1);
                        tracing::debug!(worker = %self.worker, queue, schedule = %name, %slot, "fired");
                    }
                    wait = wait.min(tick.sleep(MAX_WAIT));
                }
                // The claim loop reports outages; a failed pass is tried again.
                Err(e) if e.is_transient() => {
                    tracing::debug!(worker = %self.worker, queue, error = %e, "schedules failed");
                }
                Err(e) => {
                    tracing::warn!(worker = %self.worker, queue, error = %e, "schedules failed");
                }
            }
        }
        (wait, memo)
    }
}
