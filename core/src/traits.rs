//! The backend traits: one per concern, object-safe, summed up by [`Backend`].
//! Conveniences built on them, which no backend overrides, are in [`crate::ext`].

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use crate::{
    Batch, BatchProgress, ClaimRequest, ClaimedJob, Enqueued, Event, JobId, JobInfo, Lease,
    Maintenance, NewJob, OnFailure, QueueStats, Result, RunningJob, Settle, Settled, WaitFor,
    settle::DEFAULT_SETTLE_BATCH,
};

/// Wake-up hints from the backend (SPEC W2, B5).
pub trait Events: Send + Sync {
    /// A receiver of [`Event`]s, or `None` when the backend cannot notify (callers then
    /// poll).
    ///
    /// # Behavior
    /// - Events are hints only: a missed or lagged event must never lose a job, so
    ///   callers re-check state after waking and poll as a fallback.
    /// - A backend that returns `Some` sends [`EventKind::Ready`](crate::EventKind) when
    ///   jobs become claimable by enqueue or release, and
    ///   [`EventKind::Finished`](crate::EventKind) when a job finishes.
    /// - A backend whose notifications can be lost (a dropped notification connection)
    ///   sends [`EventKind::Resync`](crate::EventKind) once it listens again; every
    ///   listener then re-checks whatever it waits for, whatever its queue.
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        None
    }
}

/// Storing new jobs (SPEC E).
#[async_trait]
pub trait Enqueue: Send + Sync {
    /// Stores `jobs`, all of one queue, atomically; returns their ids in input order.
    ///
    /// # Behavior
    /// - All jobs are stored or none; the ids come back in input order and increase in
    ///   enqueue order within the queue (SPEC E1).
    /// - A job with `run_at` in the future is not claimable before then, by server time
    ///   (SPEC E2).
    /// - With a `dedupe_key` held by an unfinished job of the queue (or by an earlier job
    ///   of the same call), the existing id comes back flagged `deduplicated` and nothing
    ///   is stored for that job (SPEC E3).
    /// - Invalid input — queue name, payload over the limit, `max_attempts` outside
    ///   1..=1000, a stage without a batch, jobs of different queues, a batch that is
    ///   unknown, of another queue, sealed or halted — is [`Error::InvalidInput`] naming
    ///   the field, and nothing of the call is stored (SPEC E4, X2).
    /// - A stage lower than the batch's highest released stage is
    ///   [`Error::StageClosed`], and nothing of the call is stored (SPEC B3).
    /// - Names, keys and payloads are bound as parameters, never spliced into SQL or
    ///   scripts: hostile text is stored verbatim (SPEC X2).
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>>;
}

/// Taking jobs to run (SPEC C).
#[async_trait]
pub trait Claim: Events {
    /// Claims up to `req.limit` claimable jobs of `req.queue` for `req.worker`.
    ///
    /// # Behavior
    /// - Returns at most `limit` jobs (`limit` in 1..=1000, else
    ///   [`Error::InvalidInput`] on `limit`), each with a fresh random token, its attempt
    ///   number (1 on first claim) and its lease expiry; a zero lease is
    ///   [`Error::InvalidInput`] on `lease` (SPEC C1).
    /// - No job is returned to two claimers while a lease on it holds, however many
    ///   claimers run at once (SPEC C2).
    /// - Returns the earliest claimable jobs by `(priority, run_at, id)`, sorted so
    ///   (SPEC C3).
    /// - Never waits for another claimer, and answers at once on an empty queue
    ///   (SPEC C4).
    /// - A running job whose lease expired is claimable again with attempt + 1 when it
    ///   has attempts left; otherwise it becomes `dead` with error "lease expired"
    ///   (SPEC C5).
    /// - Never lets a queue run more than its `max_running`; a paused queue returns
    ///   nothing (SPEC C6).
    /// - Respects groups (SPEC G1–G4) and stages (SPEC B2): jobs that must wait are
    ///   skipped and the limit is filled from other eligible jobs.
    async fn claim(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>>;
}

/// Settling leases (SPEC L).
#[async_trait]
pub trait Complete: Send + Sync {
    /// Settles many leases in one call and one round trip (SPEC L6).
    ///
    /// # Behavior
    /// - Each lease is judged on its own token exactly as [`complete`](Self::complete),
    ///   [`fail`](Self::fail) and [`release`](Self::release) describe; the result vector
    ///   has one entry per input, in input order, and a stale token yields
    ///   [`Error::StaleLease`] for its entry only (SPEC L6).
    /// - More than 1000 leases, or a bad queue name or retry time, is
    ///   [`Error::InvalidInput`] for the whole call and nothing is settled.
    /// - Finishing a job releases what waited for it: the next job of its group (SPEC G2)
    ///   and, when it was the last unfinished job of its stage, the next stage of its
    ///   batch (SPEC B2); a dead job in a `Halt` batch cancels later stages (SPEC B6).
    /// - Every settled attempt is closed in the execution log (SPEC L5).
    async fn settle_many(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>>;

    /// How many outcomes a [`Worker`](crate::worker::Worker) gathers into one
    /// [`settle_many`](Self::settle_many) call when its
    /// [`settle_batch`](crate::worker::WorkerBuilder::settle_batch) is not set.
    ///
    /// # Behavior
    /// - A preference, not a limit: `settle_many` takes up to 1000 leases in one call
    ///   whatever this returns, and a worker keeps the value within 1..=1000.
    /// - 128 unless the backend says otherwise. A backend whose every call costs well
    ///   beyond its leases (a transaction, its commit and a few round trips) prefers
    ///   more. Outcomes wait no longer to be gathered, since a worker still sends what
    ///   it has once its [`settle_delay`](crate::worker::WorkerBuilder::settle_delay)
    ///   passes; a bigger call takes longer to run.
    fn preferred_settle_batch(&self) -> usize {
        DEFAULT_SETTLE_BATCH
    }

    /// Moves the lease's expiry to server now + `extend` (SPEC L3).
    ///
    /// # Behavior
    /// - While the token holds the job (and the lease has not expired), returns the new
    ///   expiry (SPEC L3).
    /// - Otherwise [`Error::StaleLease`] and nothing changes (SPEC L3).
    /// - `extend` of zero or over 7 days is [`Error::InvalidInput`] on `extend`.
    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>>;
}

/// Batches and ordered stages: the order barrier (SPEC B).
#[async_trait]
pub trait OrderBarrier: Events {
    /// Opens a batch in `queue` (SPEC B1).
    ///
    /// # Behavior
    /// - Returns a new batch, unsealed, with no jobs (SPEC B1).
    /// - A bad queue name is [`Error::InvalidInput`] on `queue`.
    async fn open_batch(&self, queue: &str, on_failure: OnFailure) -> Result<Batch>;

    /// Seals the batch: no more jobs (SPEC B4).
    ///
    /// # Behavior
    /// - Later enqueues into it are [`Error::InvalidInput`] on `batch` (SPEC B3).
    /// - Sealing twice is fine; an unknown batch is [`Error::NotFound`].
    async fn seal(&self, batch: &Batch) -> Result<()>;

    /// The batch's progress: counts per stage, sealed, failed (SPEC B5, M1).
    ///
    /// # Behavior
    /// - Counts every job of the batch exactly once, by stage and state (SPEC B5).
    /// - An unknown batch is [`Error::NotFound`].
    async fn batch_progress(&self, batch: &Batch) -> Result<BatchProgress>;

    /// Whether `target` is reached, without counting the batch's jobs (SPEC B5).
    ///
    /// [`wait`](Self::wait) asks this at every check and reads the counts once, at the
    /// end. The server backends answer it from their index of unfinished jobs by
    /// stage, so a check costs the same for a batch of ten jobs or a million; the
    /// default (the in-memory backend's) reads the whole
    /// [`batch_progress`](Self::batch_progress).
    ///
    /// # Behavior
    /// - A stage is reached when no job of it or of any stage below it is unfinished
    ///   (scheduled, ready, blocked, retrying or running), whether or not the batch is
    ///   sealed (SPEC B5).
    /// - The batch is reached when it is sealed and none of its jobs is unfinished
    ///   (SPEC B4, B5).
    /// - The answer equals [`BatchProgress::reached`] of `batch_progress` at the same
    ///   moment.
    /// - An unknown batch, or one of another queue, is [`Error::NotFound`].
    async fn reached(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        Ok(self.batch_progress(batch).await?.reached(target))
    }
}

/// Reading state for monitoring (SPEC L5, M1, M2).
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Counts per state, pause flag and `max_running` of `queue` (SPEC M1).
    ///
    /// # Behavior
    /// - Every stored job of the queue is counted once, in its current state (SPEC M1).
    /// - A queue never used has all counts zero.
    async fn queue_stats(&self, queue: &str) -> Result<QueueStats>;

    /// One job with its attempt log (SPEC L5, M1).
    ///
    /// # Behavior
    /// - Every attempt is listed with worker, start, end, outcome and error (SPEC L5).
    /// - An unknown id, or one of another queue, is [`Error::NotFound`].
    async fn job(&self, queue: &str, id: JobId) -> Result<JobInfo>;

    /// What runs now in `queue`: job, worker, attempt, since when (SPEC L5).
    async fn running(&self, queue: &str) -> Result<Vec<RunningJob>>;

    /// The progress of up to `limit` batches of `queue`, newest first (SPEC M1).
    ///
    /// # Behavior
    /// - Each entry equals what [`OrderBarrier::batch_progress`] reports for that batch
    ///   (SPEC M1, B5).
    /// - `limit` outside 1..=1000 is [`Error::InvalidInput`] on `limit`.
    async fn batches(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>>;

    /// The ids of `batch`'s jobs above `after` (all when `None`), in id order, at most
    /// `limit` (SPEC M5): a batch's jobs page by page, for tools that show what each
    /// job did (the dashboard's timeline of attempts reads each with [`job`](Self::job)).
    ///
    /// # Behavior
    /// - Every job enqueued into the batch is listed once, in whatever state, until it
    ///   is pruned; no job of another batch or of no batch is (SPEC M5).
    /// - Reading on from the last id of a page lists the rest (SPEC M5).
    /// - `limit` outside 1..=1000 is [`Error::InvalidInput`] on `limit`.
    /// - An unknown batch, or one of another queue, is [`Error::NotFound`].
    async fn batch_jobs(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>>;

    /// Up to `limit` dead jobs of `queue`, in enqueue (id) order (SPEC M2).
    async fn dead_jobs(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>>;

    /// The names of the queues in use, sorted (SPEC M4): for tools that show every
    /// queue, or look for a job by id alone.
    ///
    /// # Behavior
    /// - Every queue holding a job, a batch or a setting (pause, `max_running`) is
    ///   listed once (SPEC M4).
    /// - A queue that was only looked at (`queue_stats`, `claim`) is not listed; one
    ///   whose jobs were all pruned may still be.
    async fn queues(&self) -> Result<Vec<String>>;
}

/// Operating queues (SPEC C6, B7, M2, M3).
#[async_trait]
pub trait Admin: Send + Sync {
    /// Stops claims of `queue` until [`resume`](Self::resume) (SPEC C6).
    async fn pause(&self, queue: &str) -> Result<()>;

    /// Lets claims of `queue` go on (SPEC C6).
    async fn resume(&self, queue: &str) -> Result<()>;

    /// Sets (or with `None` lifts) the limit of running jobs of `queue` (SPEC C6).
    ///
    /// # Behavior
    /// - The number of running jobs of the queue never exceeds it, across all workers
    ///   (SPEC C6).
    /// - Zero is [`Error::InvalidInput`] on `max_running`: use [`pause`](Self::pause).
    async fn set_max_running(&self, queue: &str, max_running: Option<u32>) -> Result<()>;

    /// Cancels one job (SPEC B7).
    ///
    /// # Behavior
    /// - A job not started, or retrying, becomes `cancelled`; a running job becomes
    ///   `cancelled` and its lease is revoked: its `complete` gets
    ///   [`Error::StaleLease`] (SPEC B7).
    /// - Returns false when the job was already finished; an unknown job is
    ///   [`Error::NotFound`].
    /// - Cancelling releases what waited for the job, as finishing does (SPEC G2, B2).
    async fn cancel_job(&self, queue: &str, id: JobId) -> Result<bool>;

    /// Cancels every unfinished job of the batch and seals it (SPEC B7); returns how many
    /// jobs were cancelled.
    async fn cancel_batch(&self, batch: &Batch) -> Result<u64>;

    /// Puts dead jobs back to `ready` (or `blocked` behind their group) with attempts
    /// reset: those in `ids`, or every dead job of the queue when `ids` is `None`
    /// (SPEC M2). Returns how many.
    ///
    /// # Behavior
    /// - Only dead jobs move; others named in `ids` are left alone (SPEC M2).
    /// - Dead jobs of a batch stay dead: running one again after later stages started
    ///   would break the order barrier (SPEC B2). Rerun the batch instead.
    /// - A dead job whose dedupe key another unfinished job now holds stays dead, and of
    ///   several dead jobs sharing a key only the first comes back (SPEC E3).
    async fn retry_dead(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64>;

    /// A maintenance pass over `queue` (SPEC C5, M3).
    ///
    /// # Behavior
    /// - Running jobs with expired leases are made claimable again, or `dead` ("lease
    ///   expired") when out of attempts (SPEC C5).
    /// - Finished jobs that finished more than `retention` ago are deleted, with their
    ///   attempt log; unfinished jobs are never touched (SPEC M3).
    async fn maintain(&self, queue: &str, retention: Duration) -> Result<Maintenance>;

    /// [`maintain`](Self::maintain), unless another pass over `queue` runs now: then
    /// `None`, at once (SPEC M3). Workers call this on a timer, so that of many workers
    /// serving a queue one prunes at a time.
    ///
    /// # Behavior
    /// - While another caller's `try_maintain` of the queue runs, the backend's lock
    ///   makes this return `None` without touching a job (SPEC M3). Backends whose pass
    ///   is one atomic step, or whose statements are safe to interleave, may run it
    ///   anyway: the default does.
    /// - Otherwise it does what [`maintain`](Self::maintain) does.
    async fn try_maintain(&self, queue: &str, retention: Duration) -> Result<Option<Maintenance>> {
        self.maintain(queue, retention).await.map(Some)
    }
}

/// A whole backend: every trait above, usable as `Arc<dyn Backend>`.
pub trait Backend: Enqueue + Claim + Complete + OrderBarrier + Inspect + Admin {}

impl<T: Enqueue + Claim + Complete + OrderBarrier + Inspect + Admin + ?Sized> Backend for T {}
