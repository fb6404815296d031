//! The worker's slots: `concurrency` long-lived tasks, each running one job at a time.
//!
//! A task per slot, not a task per job: spawning a task for each job was more than half
//! of the runtime's CPU per job (the task's cell is an aligned allocation the job's
//! future is copied into, then entered in a task set and taken out again). The
//! `runtime_cost` example measured 6.0–6.2 µs of CPU per no-op job with a task per
//! job and 2.6–2.7 µs with slot tasks. A slot's task takes its jobs
//! from a mailbox of its own, and the claim loop hands a job only to a slot that is
//! idle, so a job never waits behind another while a slot is free.

use std::{panic::AssertUnwindSafe, sync::Arc};

use futures::FutureExt;
use tokio::{sync::mpsc, task::JoinSet};

use super::{
    job::{Assigned, JobRun},
    slot::{Shared, Slot},
};

/// The slot tasks and their mailboxes.
pub(super) struct Pool {
    pub(super) shared: Arc<Shared>,
    mailboxes: Vec<mpsc::Sender<Assigned>>,
    tasks: JoinSet<()>,
    /// What a slot task restarted in place of one that ended runs with.
    run: JobRun,
}

impl Pool {
    /// Starts `n` slot tasks, each running its jobs with `run`.
    pub(super) fn start(n: usize, run: &JobRun, worker: &str) -> Self {
        let shared = Arc::new(Shared::new(n, worker));
        let mut pool = Self {
            shared,
            mailboxes: Vec::with_capacity(n),
            tasks: JoinSet::new(),
            run: run.clone(),
        };
        for _ in 0..n {
            let mailbox = pool.serve();
            pool.mailboxes.push(mailbox);
        }
        pool
    }

    /// Starts a slot task; returns its mailbox.
    fn serve(&mut self) -> mpsc::Sender<Assigned> {
        // Capacity 1: a job is handed only to an idle slot, one at a time.
        let (tx, rx) = mpsc::channel(1);
        self.tasks.spawn(serve(self.run.clone(), rx));
        tx
    }

    /// Takes an idle slot, counted busy at once; `None` when every slot is busy.
    pub(super) fn take(&self) -> Option<Slot> {
        self.shared.take()
    }

    /// Hands a job to the idle slot it holds.
    pub(super) fn hand(&mut self, job: Assigned) {
        let index = job.slot.index();
        let Some(mailbox) = self.mailboxes.get(index) else {
            tracing::error!(
                slot = index,
                "a job was handed to a closed pool; its lease will expire"
            );
            return;
        };
        // An idle slot's mailbox is empty, and its task outlives every job (a panic
        // outside the handler is caught per job). Should the task have ended all the
        // same, a new one takes its place and the job, so one lost task cannot swallow
        // every job handed to its slot after it.
        let job = match mailbox.try_send(job) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Closed(job)) => job,
            Err(mpsc::error::TrySendError::Full(job)) => {
                // Not idle after all: the job drops with its guards, its slot frees,
                // and its lease expires.
                tracing::error!(
                    slot = job.slot.index(),
                    "a busy slot was handed a job; its lease will expire"
                );
                return;
            }
        };
        tracing::error!(slot = index, "a slot's task had ended; it is started again");
        let mailbox = self.serve();
        if mailbox.try_send(job).is_err() {
            tracing::error!(
                slot = index,
                "a new slot task could not take its job; its lease will expire"
            );
        }
        self.mailboxes[index] = mailbox;
    }

    /// Closes the mailboxes: each slot finishes its job, if any, and its task ends.
    pub(super) fn close(&mut self) {
        self.mailboxes.clear();
    }

    /// Ends every slot task, as if each had ended on its own: for tests.
    #[cfg(test)]
    async fn kill(&mut self) {
        self.tasks.abort_all();
        self.join().await;
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
pub(super) mod tests {
    use std::sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    };

    use chrono::Utc;
    use tokio::{sync::mpsc, time::Instant};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{
        ClaimedJob, JobId, Lease, LeaseToken, Outcome,
        worker::{
            Handler, JobError,
            control::{Control, Ended, Msg, Settling},
        },
    };

    /// A pool of `n` slots whose handler counts its runs; the outcomes' channel.
    fn pool(n: usize) -> (Pool, Arc<AtomicU32>, mpsc::Receiver<Settling>) {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let (pool, outcomes) = pool_with(
            n,
            Arc::new(move |_job: ClaimedJob| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, JobError>(()) }
            }),
        );
        (pool, runs, outcomes)
    }

    fn pool_with(n: usize, handler: Arc<dyn Handler>) -> (Pool, mpsc::Receiver<Settling>) {
        let (settle, outcomes) = mpsc::channel(16);
        let run = JobRun {
            handler,
            timeout: None,
            abort: CancellationToken::new(),
            settle,
            max_result: crate::progress::MAX_RESULT_BYTES,
        };
        (Pool::start(n, &run, "test"), outcomes)
    }

    /// Hands `job` to an idle slot with a fresh control; returns the control and what
    /// the keeper hears.
    fn hand(pool: &mut Pool, job: ClaimedJob) -> (Arc<Control>, mpsc::UnboundedReceiver<Msg>) {
        hand_by(
            pool,
            job,
            Instant::now() + std::time::Duration::from_secs(3600),
        )
    }

    /// [`hand`], with the last moment the job may start.
    fn hand_by(
        pool: &mut Pool,
        job: ClaimedJob,
        start_by: Instant,
    ) -> (Arc<Control>, mpsc::UnboundedReceiver<Msg>) {
        let (keeper, heard) = mpsc::unbounded_channel();
        let ended = Ended::new(keeper, &job.lease);
        let control = Arc::new(Control::default());
        let slot = pool.take().expect("an idle slot");
        pool.hand(Assigned {
            job,
            control: control.clone(),
            slot,
            ended,
            start_by,
            claimed_at: Instant::now(),
        });
        (control, heard)
    }

    /// A claimed job of queue `q` with id `id`, for the worker's unit tests.
    pub(in crate::worker) fn job(id: i64) -> ClaimedJob {
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

    /// SPEC W1 (claims up to its free slots): a slot is taken only while idle, and one
    /// that frees is idle again.
    #[tokio::test]
    async fn only_idle_slots_are_taken_and_a_freed_one_is_idle_again() {
        let (pool, _, _) = pool(2);
        let first = pool.take().expect("two idle");
        let second = pool.take().expect("one idle");
        assert_ne!(first.index(), second.index());
        assert!(pool.take().is_none(), "every slot is busy");
        assert_eq!(pool.shared.busy(), 2);
        let index = first.index();
        drop(first);
        assert_eq!(pool.shared.busy(), 1);
        assert_eq!(pool.take().map(|s| s.index()), Some(index));
    }

    /// SPEC W1: a job handed to a slot runs its handler, and its outcome goes on to be
    /// settled.
    #[tokio::test]
    async fn a_handed_job_runs_and_its_outcome_goes_to_the_settler() {
        let (mut pool, runs, mut outcomes) = pool(1);
        let _heard = hand(&mut pool, job(7));
        let (settle, _ended) = outcomes.recv().await.expect("an outcome");
        assert_eq!(settle.lease.job, JobId(7));
        assert!(matches!(settle.outcome, Outcome::Complete));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        pool.close();
        pool.join().await;
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }

    /// SPEC W1 (a handler whose lease is lost never runs beside the next attempt): a job
    /// stopped before its slot starts it never runs its handler.
    #[tokio::test]
    async fn a_job_stopped_before_its_slot_starts_it_never_runs() {
        let (mut pool, runs, mut outcomes) = pool(1);
        // Stopped before its slot task first runs: the test's runtime has one thread,
        // and nothing here yields before the stop.
        let (control, mut heard) = hand(&mut pool, job(8));
        control.stop();
        pool.close();
        pool.join().await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
        assert!(outcomes.try_recv().is_err(), "no outcome");
        assert!(matches!(heard.try_recv(), Ok(Msg::Ended(JobId(8), _))));
        assert!(control.finished() && !control.handed());
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }

    /// SPEC W1 (a frozen worker never runs a job beside its next attempt): a job that
    /// reaches its slot past its start deadline, as after a SIGSTOP between the hand-off
    /// and the slot's turn, is stopped, never started.
    #[tokio::test]
    async fn a_job_past_its_start_deadline_is_stopped_not_started() {
        let (mut pool, runs, mut outcomes) = pool(1);
        let (control, mut heard) = hand_by(&mut pool, job(9), Instant::now());
        pool.close();
        pool.join().await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
        assert!(outcomes.try_recv().is_err(), "no outcome");
        assert!(control.stopped(), "counted as a lease lost");
        assert!(matches!(heard.try_recv(), Ok(Msg::Ended(JobId(9), _))));
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }

    /// SPEC W1: the keeper stops a job whose handler waits on something that is ready
    /// by the time the job's task runs again: the handler is dropped, not polled
    /// through it.
    #[tokio::test]
    async fn a_stopped_job_is_not_polled_again() {
        let (waiting_tx, mut waiting) = mpsc::channel::<()>(1);
        let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
        let go_rx = Arc::new(Mutex::new(Some(go_rx)));
        let after = Arc::new(AtomicU32::new(0));
        let seen = after.clone();
        let (mut pool, mut outcomes) = pool_with(
            1,
            Arc::new(move |_job: ClaimedJob| {
                let (waiting_tx, seen) = (waiting_tx.clone(), seen.clone());
                let go = go_rx.lock().unwrap().take().expect("one job");
                async move {
                    waiting_tx.send(()).await.ok();
                    go.await.ok();
                    seen.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, JobError>(())
                }
            }),
        );
        let (control, _heard) = hand(&mut pool, job(9));
        waiting.recv().await.expect("the handler waits");
        // Both before the slot's task runs again (one thread, no yield in between).
        go.send(()).expect("the handler waits");
        control.stop();
        pool.close();
        pool.join().await;
        assert_eq!(after.load(Ordering::SeqCst), 0, "not polled past its await");
        assert!(outcomes.try_recv().is_err(), "no outcome");
        assert_eq!(pool.shared.busy(), 0, "the slot freed");
    }

    /// SPEC W1, X3 (nothing lost): a slot whose task ended takes the next job on a new
    /// task, rather than dropping it and every job after it.
    #[tokio::test]
    async fn a_slot_whose_task_ended_is_started_again_with_the_job() {
        let (mut pool, runs, mut outcomes) = pool(1);
        pool.kill().await;
        let _heard = hand(&mut pool, job(10));
        // Bounded: a job handed to the ended task would be dropped, and no outcome come.
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), outcomes.recv());
        let (settle, _ended) = got.await.expect("in time").expect("an outcome");
        assert_eq!(settle.lease.job, JobId(10));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // And the slot goes on serving.
        let _heard = hand(&mut pool, job(11));
        let (settle, _ended) = outcomes.recv().await.expect("an outcome");
        assert_eq!(settle.lease.job, JobId(11));
    }
}
