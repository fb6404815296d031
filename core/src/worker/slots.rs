//! The worker's slots: `concurrency` long-lived tasks, each running one job at a time.
//!
//! A task per slot, not a task per job: spawning a task for each job was more than half
//! of the runtime's CPU per job (the task's cell is an aligned allocation the job's
//! future is copied into, then entered in a task set and taken out again). The
//! `runtime_cost` example measured 6.0–6.2 µs of CPU per no-op job with a task per
//! job and 2.6–2.7 µs with slot tasks (`docs/BENCHMARKS.md`, Findings 22). A slot's task takes its jobs
//! from a mailbox of its own, and the claim loop hands a job only to a slot that is
//! idle, so a job never waits behind another while a slot is free.

use std::{
    panic::AssertUnwindSafe,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
};

use futures::FutureExt;
use tokio::{
    sync::{Notify, mpsc},
    task::JoinSet,
};

use super::job::{Assigned, JobRun};

/// What the slots share with the claim loop: how many are busy, which are idle, and a
/// wake-up for the loop when one frees.
#[derive(Default)]
pub(super) struct Shared {
    busy: AtomicU32,
    idle: Mutex<Vec<usize>>,
    pub(super) freed: Notify,
}

impl Shared {
    pub(super) fn busy(&self) -> u32 {
        self.busy.load(Ordering::SeqCst)
    }
}

/// Holds one slot for one job; frees it when dropped, however the job ends.
pub(super) struct Slot {
    shared: Arc<Shared>,
    index: usize,
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
        self.shared.freed.notify_one();
    }
}

/// The slot tasks and their mailboxes.
pub(super) struct Pool {
    pub(super) shared: Arc<Shared>,
    mailboxes: Vec<mpsc::Sender<Assigned>>,
    tasks: JoinSet<()>,
}

impl Pool {
    /// Starts `n` slot tasks, each running its jobs with `run`.
    pub(super) fn start(n: usize, run: &JobRun) -> Self {
        let shared = Arc::new(Shared::default());
        let mut tasks = JoinSet::new();
        let mut mailboxes = Vec::with_capacity(n);
        for _ in 0..n {
            // Capacity 1: a job is handed only to an idle slot, one at a time.
            let (tx, rx) = mpsc::channel(1);
            mailboxes.push(tx);
            tasks.spawn(serve(run.clone(), rx));
        }
        // Popped from the end: the first slots are used first.
        *shared.idle.lock().unwrap_or_else(PoisonError::into_inner) = (0..n).rev().collect();
        Self {
            shared,
            mailboxes,
            tasks,
        }
    }

    /// Takes an idle slot, counted busy at once; `None` when every slot is busy.
    pub(super) fn take(&self) -> Option<Slot> {
        let index = self
            .shared
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        self.shared.busy.fetch_add(1, Ordering::SeqCst);
        Some(Slot {
            shared: self.shared.clone(),
            index,
        })
    }

    /// Hands a job to the idle slot it holds.
    pub(super) fn hand(&self, job: Assigned) {
        let index = job.slot.index;
        // An idle slot's mailbox is empty and its task alive (it outlives every job: a
        // panic outside the handler is caught per job). Should either fail, the job is
        // dropped with its guards: its slot frees, and the keeper hears that it ended.
        let Some(mailbox) = self.mailboxes.get(index) else {
            tracing::error!(
                slot = index,
                "a job was handed to a closed pool; its lease will expire"
            );
            return;
        };
        if let Err(e) = mailbox.try_send(job) {
            tracing::error!(slot = index, error = %e, "a slot could not take its job; its lease will expire");
        }
    }

    /// Closes the mailboxes: each slot finishes its job, if any, and its task ends.
    pub(super) fn close(&mut self) {
        self.mailboxes.clear();
    }

    /// Waits for every slot task to end.
    pub(super) async fn join(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One slot's task: runs the jobs handed to it, one at a time, until its mailbox
/// closes.
async fn serve(run: JobRun, mut rx: mpsc::Receiver<Assigned>) {
    while let Some(job) = rx.recv().await {
        // The handler's own panics are caught inside; this catches the runtime's, so a
        // bug costs one job, not the slot.
        if AssertUnwindSafe(run.run(job)).catch_unwind().await.is_err() {
            tracing::error!("a job's run panicked outside its handler");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use chrono::Utc;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{
        ClaimedJob, JobId, Lease, LeaseToken, Outcome,
        worker::{
            JobError,
            job::{Control, Ended, Settling},
            keeper,
        },
    };

    /// A pool of `n` slots whose handler counts its runs; the outcomes' channel.
    fn pool(n: usize) -> (Pool, Arc<AtomicU32>, mpsc::Receiver<Settling>) {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let (settle, outcomes) = mpsc::channel(16);
        let run = JobRun {
            handler: Arc::new(move |_job: ClaimedJob| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, JobError>(()) }
            }),
            timeout: None,
            abort: CancellationToken::new(),
            settle,
        };
        (Pool::start(n, &run), runs, outcomes)
    }

    fn job(id: i64) -> ClaimedJob {
        ClaimedJob {
            lease: Lease {
                queue: "q".into(),
                job: JobId(id),
                token: LeaseToken::random(),
                attempt: 1,
                expires_at: Utc::now(),
                worker: "w".into(),
            },
            payload: Vec::new(),
            priority: 0,
            run_at: Utc::now(),
            max_attempts: 1,
            group: None,
            batch: None,
            stage: None,
            enqueued_by: None,
        }
    }

    #[tokio::test]
    async fn only_idle_slots_are_taken_and_a_freed_one_is_idle_again() {
        let (pool, _, _) = pool(2);
        let first = pool.take().expect("two idle");
        let second = pool.take().expect("one idle");
        assert_ne!(first.index, second.index);
        assert!(pool.take().is_none(), "every slot is busy");
        assert_eq!(pool.shared.busy(), 2);
        let index = first.index;
        drop(first);
        assert_eq!(pool.shared.busy(), 1);
        assert_eq!(pool.take().map(|s| s.index), Some(index));
    }

    #[tokio::test]
    async fn a_handed_job_runs_and_its_outcome_goes_to_the_settler() {
        let (mut pool, runs, mut outcomes) = pool(1);
        let (keeper, _heard) = mpsc::unbounded_channel::<keeper::Msg>();
        let job = job(7);
        let ended = Ended::new(keeper, &job.lease);
        let slot = pool.take().expect("idle");
        pool.hand(Assigned {
            job,
            control: Arc::new(Control::default()),
            slot,
            ended,
        });
        let (settle, _ended) = outcomes.recv().await.expect("an outcome");
        assert_eq!(settle.lease.job, JobId(7));
        assert!(matches!(settle.outcome, Outcome::Complete));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        pool.close();
        pool.join().await;
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }

    #[tokio::test]
    async fn a_job_stopped_before_its_slot_starts_it_never_runs() {
        let (mut pool, runs, mut outcomes) = pool(1);
        let (keeper, mut heard) = mpsc::unbounded_channel::<keeper::Msg>();
        let job = job(8);
        let ended = Ended::new(keeper, &job.lease);
        let control = Arc::new(Control::default());
        control.stop();
        let slot = pool.take().expect("idle");
        pool.hand(Assigned {
            job,
            control: control.clone(),
            slot,
            ended,
        });
        pool.close();
        pool.join().await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
        assert!(outcomes.try_recv().is_err(), "no outcome");
        assert!(matches!(
            heard.try_recv(),
            Ok(keeper::Msg::Ended(JobId(8), _))
        ));
        assert!(control.finished() && !control.handed());
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }
}
