//! The backend traits: one per concern, object-safe, summed up by [`Backend`].
//! Conveniences built on them, which no backend overrides, are in [`crate::ext`].
//!
//! Validation is done here, once: each public method (`enqueue`, `claim`, ...) checks
//! its input with [`crate::validate`] and then calls the backend's required
//! `*_unchecked` method, as `object_store`'s `put` calls `put_opts`. A backend implements
//! only the `*_unchecked` methods and never overrides the public ones, so bad input is
//! rejected the same way everywhere, before any I/O, and a new operation cannot forget
//! to check. Callers use the public methods; a wrapper (see
//! [`delegate!`](crate::delegate)) passes the `*_unchecked` calls on, so input is
//! checked once however many wrappers there are.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use crate::{
    Batch, BatchProgress, ClaimRequest, ClaimedJob, Enqueued, Event, JobFilter, JobId, JobInfo,
    JobPage, Lease, Limits, Maintenance, NewBatch, NewJob, OnFailure, ProgressReport, QueueStats,
    QueueUpdate, Rate, Result, RunningJob, Settle, Settled, WaitFor, WorkerBeat, WorkerSeen,
    schedule::{self, Fire, Fired, Schedule, ScheduleInfo, StoredSchedule, Tick},
    settle::DEFAULT_SETTLE_BATCH,
    validate,
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

    /// Whether a cancel made anywhere reaches this handle's
    /// [`subscribe`](Self::subscribe)rs as an [`EventKind::Revoked`](crate::EventKind),
    /// so that a worker learns of it without polling (SPEC B8).
    ///
    /// # Behavior
    /// - `true` only when every cancel of a running job, from any process, sends
    ///   `Revoked` for its queue (PostgreSQL's `NOTIFY`, Redis's `PUBLISH`, a store
    ///   only one process can open). Otherwise workers poll
    ///   [`lost_leases`](crate::Complete::lost_leases) while they hold leases; with it,
    ///   they read it once a second, for cancels sent while their listener was away.
    fn pushes_revocations(&self) -> bool {
        false
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
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        validate::new_jobs(&jobs, &self.limits())?;
        self.enqueue_unchecked(jobs)
            .await
            .map_err(|e| e.during("enqueue"))
    }

    /// [`enqueue`](Self::enqueue) after validation: `jobs` passed
    /// [`validate::new_jobs`] with [`limits`](Self::limits).
    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>>;

    /// The limits [`enqueue`](Self::enqueue) checks jobs against (the payload's size).
    fn limits(&self) -> Limits {
        Limits::default()
    }
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
    async fn claim(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        validate::claim(&req)?;
        self.claim_unchecked(req)
            .await
            .map_err(|e| e.during("claim"))
    }

    /// [`claim`](Self::claim) after validation: `req` passed [`validate::claim`].
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>>;

    /// [`claim`](Self::claim), also saying how long until the queue's rate allows the
    /// next start when it cut the claim short: the worker sleeps that long instead of
    /// polling (SPEC K10).
    ///
    /// # Behavior
    /// - Claims exactly as [`claim`](Self::claim) does.
    /// - Never starts more jobs of a queue than its rate allows: at most `count` in
    ///   any window of `per` on the server's clock, across all claimers (SPEC K9).
    /// - `next_in` is `Some` when the rate gave fewer jobs than the claim could
    ///   otherwise have taken (SPEC K10).
    async fn claim_paced(&self, req: ClaimRequest) -> Result<crate::Claimed> {
        validate::claim(&req)?;
        self.claim_paced_unchecked(req)
            .await
            .map_err(|e| e.during("claim"))
    }

    /// [`claim_paced`](Self::claim_paced) after validation. The default claims with
    /// [`claim_unchecked`](Self::claim_unchecked) and never names a wait: a backend
    /// with rates overrides it (and has `claim_unchecked` call it).
    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<crate::Claimed> {
        Ok(crate::Claimed::jobs(self.claim_unchecked(req).await?))
    }
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
    ///   batch (SPEC B2); a dead job in a `Halt` batch cancels the batch's other unfinished
    ///   jobs, running ones included (SPEC B6).
    /// - Every settled attempt is closed in the execution log (SPEC L5).
    async fn settle_many(&self, mut settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        validate::settles(&mut settles)?;
        self.settle_many_unchecked(settles)
            .await
            .map_err(|e| e.during("settle_many"))
    }

    /// [`settle_many`](Self::settle_many) after validation: `settles` passed
    /// [`validate::settles`], which also cleaned their error texts.
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>>;

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
    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        validate::queue_name(&lease.queue)?;
        validate::lease_length("extend", extend)?;
        self.heartbeat_unchecked(lease, extend)
            .await
            .map_err(|e| e.during("heartbeat"))
    }

    /// [`heartbeat`](Self::heartbeat) after validation of the queue and `extend`.
    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>>;

    /// The jobs of `leases` whose lease no longer holds: the job is not `running` under
    /// that token any more (cancelled, finished, expired and claimed again, pruned).
    /// A read: nothing changes. Workers call it when a cancel may have hit them, to stop
    /// the handler at once (SPEC B8).
    ///
    /// # Behavior
    /// - A job still `running` under the lease's token is not returned, even past the
    ///   lease's expiry: until something takes the job, the lease holds.
    /// - A job cancelled while running, or gone, is returned; each job at most once, in
    ///   no particular order.
    /// - More than 1000 leases, or a bad queue name, is [`Error::InvalidInput`].
    async fn lost_leases(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        validate::leases(leases)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.lost_leases_unchecked(leases)
            .await
            .map_err(|e| e.during("lost_leases"))
    }

    /// [`lost_leases`](Self::lost_leases) after validation: at most 1000 leases, each
    /// of a valid queue, at least one.
    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>>;

    /// Stores each report's progress on its job while its lease holds; returns the jobs
    /// whose lease no longer holds, for which nothing is stored (SPEC L7). Workers call
    /// it at most once a second with every job's latest report, never on the claim or
    /// settle path.
    ///
    /// # Behavior
    /// - A job `running` under the report's token gets the report's progress, tagged
    ///   with the lease's attempt; [`Inspect::job`] and [`Inspect::running`] show it,
    ///   and it stays after the job finishes.
    /// - A job no longer running under that token (cancelled, finished, taken over,
    ///   pruned) is returned and keeps what it had, as [`lost_leases`](Self::lost_leases)
    ///   would name it.
    /// - More than 1000 reports, a job twice, a bad queue name, a percent over 100 or a
    ///   message over 255 bytes is [`Error::InvalidInput`] naming the field, and nothing
    ///   is stored.
    async fn report_progress(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        validate::progress(reports)?;
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        self.report_progress_unchecked(reports)
            .await
            .map_err(|e| e.during("report_progress"))
    }

    /// [`report_progress`](Self::report_progress) after validation: at most 1000
    /// reports, at least one, each job once, each valid.
    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>>;

    /// Stores `beat` as `queue`'s word from its worker, with the server's time, in
    /// place of that worker's last one (SPEC M9). Workers send it every
    /// [`BEAT_EVERY`](crate::workers::BEAT_EVERY) for each queue they serve.
    ///
    /// # Behavior
    /// - [`Inspect::workers`] then lists the worker once, with this beat (SPEC M9).
    /// - A bad beat is [`Error::InvalidInput`] naming its field
    ///   ([`WorkerBeat::validate`]), and nothing is stored.
    async fn worker_beat(&self, queue: &str, beat: &WorkerBeat) -> Result<()> {
        validate::queue_name(queue)?;
        beat.validate()?;
        self.worker_beat_unchecked(queue, beat)
            .await
            .map_err(|e| e.during("worker_beat"))
    }

    /// [`worker_beat`](Self::worker_beat) after validation of `queue` and `beat`.
    async fn worker_beat_unchecked(&self, queue: &str, beat: &WorkerBeat) -> Result<()>;
}

/// Batches and ordered stages: the order barrier (SPEC B).
#[async_trait]
pub trait OrderBarrier: Events {
    /// Opens a batch in `queue` (SPEC B1).
    ///
    /// # Behavior
    /// - Returns a new batch, unsealed, with no jobs (SPEC B1).
    /// - A bad queue name is [`Error::InvalidInput`] on `queue`.
    async fn open_batch(&self, queue: &str, on_failure: OnFailure) -> Result<Batch> {
        self.open_batch_with(&NewBatch::new(queue).on_failure(on_failure))
            .await
    }

    /// Opens a batch with a name people read, as [`open_batch`](Self::open_batch)
    /// does (SPEC B1).
    ///
    /// # Behavior
    /// - Its progress carries `name` (SPEC M1); names need not be unique.
    /// - A name that is not a label (1 to 255 bytes, no control characters) is
    ///   [`Error::InvalidInput`] on `name`, and no batch is opened.
    async fn open_named_batch(
        &self,
        queue: &str,
        on_failure: OnFailure,
        name: &str,
    ) -> Result<Batch> {
        self.open_batch_with(&NewBatch::new(queue).on_failure(on_failure).name(name))
            .await
    }

    /// Opens a batch with all its policies (SPEC B1, B6, D4).
    ///
    /// # Behavior
    /// - As [`open_named_batch`](Self::open_named_batch) when it has a name.
    /// - Its progress carries its `after_failure` policy (SPEC D4).
    /// - A backend that does not keep dependencies refuses an `after_failure` other
    ///   than the default with [`Error::InvalidInput`] on `after_failure`.
    async fn open_batch_with(&self, batch: &NewBatch) -> Result<Batch> {
        validate::queue_name(&batch.queue)?;
        if let Some(name) = &batch.name {
            validate::label("name", name)?;
        }
        self.open_batch_unchecked(batch)
            .await
            .map_err(|e| e.during("open_batch"))
    }

    /// [`open_batch_with`](Self::open_batch_with) after validation of its queue and
    /// name.
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch>;

    /// Seals the batch: no more jobs (SPEC B4).
    ///
    /// # Behavior
    /// - Later enqueues into it are [`Error::InvalidInput`] on `batch` (SPEC B3).
    /// - Sealing twice is fine; an unknown batch is [`Error::NotFound`].
    async fn seal(&self, batch: &Batch) -> Result<()> {
        validate::queue_name(&batch.queue)?;
        self.seal_unchecked(batch)
            .await
            .map_err(|e| e.during("seal"))
    }

    /// [`seal`](Self::seal) after validation of the batch's queue.
    async fn seal_unchecked(&self, batch: &Batch) -> Result<()>;

    /// The batch's progress: counts per stage, sealed, failed (SPEC B5, M1).
    ///
    /// # Behavior
    /// - Counts every job of the batch exactly once, by stage and state (SPEC B5).
    /// - An unknown batch is [`Error::NotFound`].
    async fn batch_progress(&self, batch: &Batch) -> Result<BatchProgress> {
        validate::queue_name(&batch.queue)?;
        self.batch_progress_unchecked(batch)
            .await
            .map_err(|e| e.during("batch_progress"))
    }

    /// [`batch_progress`](Self::batch_progress) after validation of the batch's queue.
    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress>;

    /// Whether `target` is reached, without counting the batch's jobs (SPEC B5).
    ///
    /// [`wait`](crate::OrderBarrierExt::wait) asks this at every check and reads the
    /// counts once, at the end.
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
        validate::queue_name(&batch.queue)?;
        self.reached_unchecked(batch, target)
            .await
            .map_err(|e| e.during("reached"))
    }

    /// [`reached`](Self::reached) after validation of the batch's queue.
    ///
    /// The server backends answer it from their index of unfinished jobs by stage, so
    /// a check costs the same for a batch of ten jobs or a million; the default (the
    /// in-memory backend's) reads the whole
    /// [`batch_progress`](Self::batch_progress_unchecked).
    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        Ok(self.batch_progress_unchecked(batch).await?.reached(target))
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
    async fn queue_stats(&self, queue: &str) -> Result<QueueStats> {
        validate::queue_name(queue)?;
        self.queue_stats_unchecked(queue)
            .await
            .map_err(|e| e.during("queue_stats"))
    }

    /// [`queue_stats`](Self::queue_stats) after validation of `queue`.
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats>;

    /// The limits of `queue`'s keys and how many jobs of each run (SPEC K7).
    ///
    /// # Behavior
    /// - Lists each key with running jobs or a limit of its own, by key, at most
    ///   [`KEYS_LISTED`](crate::KEYS_LISTED); running counts jobs claimed ahead.
    /// - `default` is the limit of every other key.
    async fn key_limits(&self, queue: &str) -> Result<crate::KeyLimits> {
        validate::queue_name(queue)?;
        self.key_limits_unchecked(queue)
            .await
            .map_err(|e| e.during("key_limits"))
    }

    /// [`key_limits`](Self::key_limits) after validation of `queue`.
    async fn key_limits_unchecked(&self, queue: &str) -> Result<crate::KeyLimits>;

    /// One job with its attempt log (SPEC L5, M1).
    ///
    /// # Behavior
    /// - Every attempt is listed with worker, start, end, outcome and error (SPEC L5).
    /// - An unknown id, or one of another queue, is [`Error::NotFound`].
    async fn job(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        validate::queue_name(queue)?;
        self.job_unchecked(queue, id)
            .await
            .map_err(|e| e.during("job"))
    }

    /// [`job`](Self::job) after validation of `queue`.
    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo>;

    /// What runs now in `queue`: job, worker, attempt, since when (SPEC L5).
    async fn running(&self, queue: &str) -> Result<Vec<RunningJob>> {
        validate::queue_name(queue)?;
        self.running_unchecked(queue)
            .await
            .map_err(|e| e.during("running"))
    }

    /// [`running`](Self::running) after validation of `queue`.
    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>>;

    /// The job holding `group` of `queue` (SPEC G2, M6): the one running, or retrying
    /// (which keeps the group until it succeeds or dies), if one is.
    ///
    /// # Behavior
    /// - A group with a running or retrying job names it; a group whose next job only
    ///   waits (ready, blocked), or with no unfinished job, names none.
    /// - A bad queue name, or a group of more than 255 bytes, is
    ///   [`Error::InvalidInput`].
    async fn group_holder(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        validate::queue_name(queue)?;
        validate::label("group", group)?;
        self.group_holder_unchecked(queue, group)
            .await
            .map_err(|e| e.during("group_holder"))
    }

    /// [`group_holder`](Self::group_holder) after validation of `queue` and `group`.
    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>>;

    /// The progress of up to `limit` batches of `queue`, newest first (SPEC M1).
    ///
    /// # Behavior
    /// - Each entry equals what [`OrderBarrier::batch_progress`] reports for that batch
    ///   (SPEC M1, B5).
    /// - `limit` outside 1..=1000 is [`Error::InvalidInput`] on `limit`.
    async fn batches(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        validate::queue_name(queue)?;
        validate::list_limit(limit)?;
        self.batches_unchecked(queue, limit)
            .await
            .map_err(|e| e.during("batches"))
    }

    /// [`batches`](Self::batches) after validation of `queue` and `limit`.
    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>>;

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
    ) -> Result<Vec<JobId>> {
        validate::queue_name(&batch.queue)?;
        validate::list_limit(limit)?;
        self.batch_jobs_unchecked(batch, after, limit)
            .await
            .map_err(|e| e.during("batch_jobs"))
    }

    /// [`batch_jobs`](Self::batch_jobs) after validation of the batch's queue and
    /// `limit`.
    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>>;

    /// Up to `limit` ids of `queue`'s jobs that match `filter`, below `before` (from
    /// the newest when `None`), newest first (SPEC M7): finding any job, in any state,
    /// page by page. Read each with [`job`](Self::job).
    ///
    /// # Behavior
    /// - Following [`JobPage::next`] from `None` lists every job that matches once,
    ///   and no other (SPEC M7).
    /// - One call looks at no more than [`LIST_SCAN`](crate::LIST_SCAN) jobs: a page
    ///   may hold fewer than `limit` jobs and still have a `next`. `next` is `None`
    ///   only when no job below the page matches (SPEC M7).
    /// - `limit` outside 1..=1000 is [`Error::InvalidInput`] on `limit`; a bad filter
    ///   is [`Error::InvalidInput`] naming its field ([`JobFilter::validate`]).
    async fn list_jobs(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage> {
        validate::queue_name(queue)?;
        validate::list_limit(limit)?;
        filter.validate()?;
        self.list_jobs_unchecked(queue, filter, before, limit)
            .await
            .map_err(|e| e.during("list_jobs"))
    }

    /// [`list_jobs`](Self::list_jobs) after validation of `queue`, `filter` and
    /// `limit`.
    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage>;

    /// The workers that beat for `queue` within the last
    /// [`BEAT_KEPT`](crate::workers::BEAT_KEPT), each with its last beat and when the
    /// server took it, the most recent first (SPEC M9).
    ///
    /// # Behavior
    /// - Each worker is listed once, with its last beat (SPEC M9).
    /// - A worker that beat only for other queues is not listed (SPEC M9).
    async fn workers(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        validate::queue_name(queue)?;
        self.workers_unchecked(queue)
            .await
            .map_err(|e| e.during("workers"))
    }

    /// [`workers`](Self::workers) after validation of `queue`.
    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<WorkerSeen>>;

    /// Up to `limit` dead jobs of `queue`, in enqueue (id) order (SPEC M2).
    ///
    /// # Behavior
    /// - `limit` outside 1..=1000 is [`Error::InvalidInput`] on `limit`.
    async fn dead_jobs(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        validate::queue_name(queue)?;
        validate::list_limit(limit)?;
        self.dead_jobs_unchecked(queue, limit)
            .await
            .map_err(|e| e.during("dead_jobs"))
    }

    /// [`dead_jobs`](Self::dead_jobs) after validation of `queue` and `limit`.
    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>>;

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
    /// Changes the settings of `queue` that `update` names, leaving the others as they
    /// are (SPEC C6); a queue paused or given a `max_running` is in use (SPEC M4).
    ///
    /// # Behavior
    /// - A paused queue's claims return nothing until it is resumed (SPEC C6).
    /// - The number of running jobs of the queue never exceeds its `max_running`,
    ///   across all workers (SPEC C6).
    /// - A `max_running` of zero is [`Error::InvalidInput`] on `max_running`: pause
    ///   instead. A bad rate ([`validate::rate`]) is [`Error::InvalidInput`] on
    ///   `rate`, as is any rate on a backend without rates. A bad queue name is
    ///   [`Error::InvalidInput`] on `queue`. Nothing is stored then.
    /// - A rate starts afresh when set: its first `burst` starts may come at once
    ///   (SPEC K8).
    /// - Resuming or raising the limit wakes the queue's workers (SPEC W2).
    async fn update_queue(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        validate::queue_name(queue)?;
        if let Some(max) = update.max_running {
            validate::max_running(max)?;
        }
        if let Some(Some(rate)) = &update.rate {
            validate::rate(rate)?;
        }
        self.update_queue_unchecked(queue, update)
            .await
            .map_err(|e| e.during("update_queue"))
    }

    /// [`update_queue`](Self::update_queue) after validation.
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()>;

    /// Stops claims of `queue` until [`resume`](Self::resume) (SPEC C6).
    async fn pause(&self, queue: &str) -> Result<()> {
        self.update_queue(queue, QueueUpdate::default().paused(true))
            .await
    }

    /// Lets claims of `queue` go on (SPEC C6).
    async fn resume(&self, queue: &str) -> Result<()> {
        self.update_queue(queue, QueueUpdate::default().paused(false))
            .await
    }

    /// Sets (or with `None` lifts) the limit of running jobs of `queue` (SPEC C6).
    ///
    /// # Behavior
    /// - As [`update_queue`](Self::update_queue) with only `max_running`.
    async fn set_max_running(&self, queue: &str, max_running: Option<u32>) -> Result<()> {
        self.update_queue(queue, QueueUpdate::default().max_running(max_running))
            .await
    }

    /// Sets the limit of `key` in `queue`, or with `key` `None` the default limit of
    /// every key without one of its own; `limit` `None` lifts it (SPEC K1, K3).
    ///
    /// # Behavior
    /// - At most `limit` jobs of the key run at once, across all workers (SPEC K2).
    /// - Lowering a limit stops nothing running; raising or lifting one lets the next
    ///   claim start more and wakes the queue's workers (SPEC K3).
    /// - A limit of zero is [`Error::InvalidInput`] on `key_limit`, a bad key on
    ///   `limit_key`; nothing is stored then. A backend without limit keys refuses
    ///   every call on `limit_key`.
    async fn set_key_limit(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        validate::queue_name(queue)?;
        if let Some(key) = key {
            validate::label("limit_key", key)?;
        }
        validate::key_limit(limit)?;
        self.set_key_limit_unchecked(queue, key, limit)
            .await
            .map_err(|e| e.during("set_key_limit"))
    }

    /// [`set_key_limit`](Self::set_key_limit) after validation.
    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()>;

    /// Sets the rate of `key` in `queue`, or with `key` `None` the default rate of
    /// every key without one of its own (each key then has its own allowance); `rate`
    /// `None` lifts it (SPEC K12).
    ///
    /// # Behavior
    /// - In any window of the rate's `per`, at most its `count` jobs of the key start,
    ///   across all workers, on the server's clock (SPEC K12).
    /// - A job its key's rate holds back holds nobody else up; it starts once the rate
    ///   allows, and a worker learns when from the claim (SPEC K13).
    /// - A new rate starts afresh; the same rate set again changes nothing; lifting
    ///   one lets the next claim start the key's jobs.
    /// - A bad rate is [`Error::InvalidInput`] on `rate` (the bounds of
    ///   [`QueueUpdate::rate`]), a bad key on `limit_key`; nothing is stored then. A
    ///   backend without rates or limit keys refuses every call on `rate`.
    async fn set_key_rate(&self, queue: &str, key: Option<&str>, rate: Option<Rate>) -> Result<()> {
        validate::queue_name(queue)?;
        if let Some(key) = key {
            validate::label("limit_key", key)?;
        }
        if let Some(rate) = &rate {
            validate::rate(rate)?;
        }
        self.set_key_rate_unchecked(queue, key, rate)
            .await
            .map_err(|e| e.during("set_key_rate"))
    }

    /// [`set_key_rate`](Self::set_key_rate) after validation. The default refuses:
    /// a backend without key rates keeps it.
    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<Rate>,
    ) -> Result<()> {
        let _ = (queue, key, rate);
        Err(crate::Error::invalid(
            "rate",
            "this backend keeps no rates for limit keys",
        ))
    }

    /// Cancels one job (SPEC B7).
    ///
    /// # Behavior
    /// - A job not started, or retrying, becomes `cancelled`; a running job becomes
    ///   `cancelled` and its lease is revoked: its `complete` gets
    ///   [`Error::StaleLease`] (SPEC B7).
    /// - Returns false when the job was already finished; an unknown job is
    ///   [`Error::NotFound`].
    /// - Cancelling releases what waited for the job, as finishing does (SPEC G2, B2).
    async fn cancel_job(&self, queue: &str, id: JobId) -> Result<bool> {
        validate::queue_name(queue)?;
        self.cancel_job_unchecked(queue, id)
            .await
            .map_err(|e| e.during("cancel_job"))
    }

    /// [`cancel_job`](Self::cancel_job) after validation of `queue`.
    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool>;

    /// Cancels every unfinished job of the batch and seals it (SPEC B7); returns how many
    /// jobs were cancelled.
    async fn cancel_batch(&self, batch: &Batch) -> Result<u64> {
        validate::queue_name(&batch.queue)?;
        self.cancel_batch_unchecked(batch)
            .await
            .map_err(|e| e.during("cancel_batch"))
    }

    /// [`cancel_batch`](Self::cancel_batch) after validation of the batch's queue.
    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64>;

    /// Cancels every unfinished job of `queue`, running ones included (SPEC B9);
    /// returns how many it cancelled.
    ///
    /// # Behavior
    /// - Every job unfinished when the call starts ends `cancelled`, as
    ///   [`cancel_job`](Self::cancel_job) would leave it; each batch that had one is
    ///   sealed and cancelled highest stage first, as
    ///   [`cancel_batch`](Self::cancel_batch) would, so no later stage is released on
    ///   the way. Jobs enqueued while it runs may be cancelled too, or not.
    /// - A running job's attempt is logged as cancelled with
    ///   [`cancelled_by::PURGE`](crate::cancelled_by::PURGE), and its handler is stopped
    ///   at once (SPEC B8); its late completion is [`Error::StaleLease`].
    /// - Finished jobs, the queue's settings and its schedules stay; a queue never used
    ///   purges nothing. A bad queue name is [`Error::InvalidInput`] on `queue`.
    async fn purge(&self, queue: &str) -> Result<u64> {
        validate::queue_name(queue)?;
        self.purge_unchecked(queue)
            .await
            .map_err(|e| e.during("purge"))
    }

    /// [`purge`](Self::purge) after validation of `queue`.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64>;

    /// Deletes the finished jobs (succeeded, dead or cancelled) of `queue` among `ids`,
    /// with their attempt logs, before their retention ends (SPEC M8). Returns how
    /// many it deleted.
    ///
    /// # Behavior
    /// - A finished job named is gone, as if pruned: [`Inspect::job`] is
    ///   [`Error::NotFound`] and no listing shows it (SPEC M8).
    /// - An unfinished job named is left as it is (cancel it first), and so is an id
    ///   unknown or of another queue (SPEC M8).
    /// - No id, or more than 1000, is [`Error::InvalidInput`] on `ids`.
    async fn delete_jobs(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        validate::queue_name(queue)?;
        validate::job_ids(ids)?;
        self.delete_jobs_unchecked(queue, ids)
            .await
            .map_err(|e| e.during("delete_jobs"))
    }

    /// [`delete_jobs`](Self::delete_jobs) after validation of `queue` and `ids`.
    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64>;

    /// Makes the jobs of `queue` among `ids` that wait only for their time due now
    /// (SPEC M10): a scheduled job, or a retry in its backoff. Returns how many moved.
    ///
    /// # Behavior
    /// - A `ready` or `retrying` job whose `run_at` is later than the server's time
    ///   gets that time as its `run_at`, and is claimable at once (SPEC M10).
    /// - Any other job named is left as it is: one already due, running, finished,
    ///   or blocked by its group or its stage (it waits for more than its time), and an
    ///   id unknown or of another queue (SPEC M10).
    /// - No id, or more than 1000, is [`Error::InvalidInput`] on `ids`.
    async fn run_now(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        validate::queue_name(queue)?;
        validate::job_ids(ids)?;
        self.run_now_unchecked(queue, ids)
            .await
            .map_err(|e| e.during("run_now"))
    }

    /// [`run_now`](Self::run_now) after validation of `queue` and `ids`.
    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64>;

    /// Puts dead jobs back to `ready` (or `blocked` behind their group) with their
    /// enqueued attempts again: those in `ids`, or every dead job of the queue when
    /// `ids` is `None` (SPEC M2). Returns how many.
    ///
    /// # Behavior
    /// - Only dead jobs move; others named in `ids` are left alone (SPEC M2).
    /// - Attempts count on: `max_attempts` grows by the attempts the job was enqueued
    ///   with (at most 32767), so its next claim is the attempt after its last; a job
    ///   that spent 32767 attempts stays dead (SPEC M2).
    /// - Dead jobs of a batch stay dead: running one again after later stages started
    ///   would break the order barrier (SPEC B2). Rerun the batch instead.
    /// - A dead job whose dedupe key another unfinished job now holds stays dead, and of
    ///   several dead jobs sharing a key only the first comes back (SPEC E3).
    async fn retry_dead(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        validate::queue_name(queue)?;
        self.retry_dead_unchecked(queue, ids)
            .await
            .map_err(|e| e.during("retry_dead"))
    }

    /// [`retry_dead`](Self::retry_dead) after validation of `queue`.
    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64>;

    /// A maintenance pass over `queue` (SPEC C5, M3).
    ///
    /// # Behavior
    /// - Running jobs with expired leases are made claimable again, or `dead` ("lease
    ///   expired") when out of attempts (SPEC C5).
    /// - Finished jobs that finished more than `retention` ago are deleted, with their
    ///   attempt log; unfinished jobs are never touched (SPEC M3).
    async fn maintain(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        validate::queue_name(queue)?;
        self.maintain_unchecked(queue, retention)
            .await
            .map_err(|e| e.during("maintain"))
    }

    /// [`maintain`](Self::maintain) after validation of `queue`.
    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance>;

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
        validate::queue_name(queue)?;
        self.try_maintain_unchecked(queue, retention)
            .await
            .map_err(|e| e.during("try_maintain"))
    }

    /// [`try_maintain`](Self::try_maintain) after validation of `queue`; the default
    /// runs [`maintain_unchecked`](Self::maintain_unchecked).
    async fn try_maintain_unchecked(
        &self,
        queue: &str,
        retention: Duration,
    ) -> Result<Option<Maintenance>> {
        self.maintain_unchecked(queue, retention).await.map(Some)
    }
}

/// Recurring jobs and batches: one enqueue per slot, with no leader (SPEC S).
///
/// A backend stores each schedule's definition (JSON text only core reads), version,
/// mark and pause flag, and fires slots with [`fire_unchecked`](Self::fire_unchecked);
/// core works out which slot is due.
#[async_trait]
pub trait Schedules: Enqueue {
    /// Stores `schedule`, or replaces the definition of the one with its queue and name
    /// (SPEC S1).
    ///
    /// # Behavior
    /// - A new schedule's mark is its `starting`, or the server's time: no slot at or
    ///   before it runs (SPEC S1).
    /// - Replacing keeps the mark and the pause flag and raises the version, so no slot
    ///   fires twice and no scheduler fires the old definition after (SPEC S1).
    /// - A malformed cron expression, an unknown time zone, a bad name or queue, no
    ///   jobs or a bad job, a catch-up window outside 1 s..=366 days is
    ///   [`Error::InvalidInput`](crate::Error::InvalidInput) naming the field, and nothing
    ///   is stored (SPEC S6).
    async fn put_schedule(&self, schedule: &Schedule) -> Result<()> {
        let definition = validate::schedule(schedule, &self.limits())?;
        self.put_schedule_unchecked(
            &schedule.queue,
            &schedule.name,
            &definition,
            schedule.starting,
        )
        .await
        .map_err(|e| e.during("put_schedule"))
    }

    /// [`put_schedule`](Self::put_schedule) after validation: `definition` is the
    /// schedule's [`Definition`](schedule::Definition) as JSON.
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()>;

    /// The schedules of `queue`, by name, each with its next slot (SPEC S5).
    ///
    /// # Behavior
    /// - Lists each stored schedule once with its pause flag, last slot, the job or
    ///   batch that slot made, and its next slot by the server's time (SPEC S5).
    async fn schedules(&self, queue: &str) -> Result<Vec<ScheduleInfo>> {
        validate::queue_name(queue)?;
        let (rows, now) = self
            .stored_schedules_unchecked(queue)
            .await
            .map_err(|e| e.during("schedules"))?;
        Ok(rows
            .into_iter()
            .map(|r| schedule::decode(queue, r, now))
            .collect())
    }

    /// The stored schedules of `queue`, by name, and the server's time.
    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)>;

    /// Deletes a schedule; returns whether it existed (SPEC S5).
    ///
    /// # Behavior
    /// - No slot of it fires after; the jobs it made are left alone (SPEC S5).
    async fn delete_schedule(&self, queue: &str, name: &str) -> Result<bool> {
        validate::queue_name(queue)?;
        validate::schedule_name(name)?;
        self.delete_schedule_unchecked(queue, name)
            .await
            .map_err(|e| e.during("delete_schedule"))
    }

    /// [`delete_schedule`](Self::delete_schedule) after validation.
    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool>;

    /// Pauses (`true`) or resumes a schedule (SPEC S5).
    ///
    /// # Behavior
    /// - A paused schedule fires no slot; resumed, it handles the slots it missed by
    ///   its policy (SPEC S3, S5).
    /// - An unknown schedule is [`Error::NotFound`](crate::Error::NotFound).
    async fn pause_schedule(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        validate::queue_name(queue)?;
        validate::schedule_name(name)?;
        self.pause_schedule_unchecked(queue, name, paused)
            .await
            .map_err(|e| e.during("pause_schedule"))
    }

    /// [`pause_schedule`](Self::pause_schedule) after validation.
    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()>;

    /// Fires every due slot of `queue`'s schedules once (SPEC S2, S3): what a
    /// [`Worker`](crate::worker::Worker) runs about once a second.
    async fn run_schedules(&self, queue: &str) -> Result<Tick> {
        schedule::run_due(self, queue).await
    }

    /// Enqueues one slot's jobs of a schedule now: an extra run that moves no mark and
    /// ignores a pause (SPEC S5).
    ///
    /// # Behavior
    /// - An unknown schedule is [`Error::NotFound`](crate::Error::NotFound).
    async fn run_schedule_now(&self, queue: &str, name: &str) -> Result<Fired> {
        validate::queue_name(queue)?;
        validate::schedule_name(name)?;
        schedule::run_now(self, queue, name).await
    }

    /// Fires one slot (SPEC S2).
    ///
    /// # Behavior
    /// - In one atomic unit (transaction, script): when the schedule exists, has
    ///   `fire.version`, is not paused, its mark lies before `fire.slot`, and the slot
    ///   is not after the server's time, moves the mark to the slot, stores the jobs
    ///   (opening and sealing a batch for them when `fire.batch` is set) and records
    ///   the slot and what it made; otherwise changes nothing and says why (SPEC S2).
    /// - With `fire.slot` `None` ("run now"), stores the jobs whatever the mark and
    ///   the pause, and changes nothing else.
    /// - A backend that locks the schedule answers [`Fired::Busy`] rather than wait
    ///   for another holder.
    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired>;
}

/// A whole backend: every trait above, usable as `Arc<dyn Backend>`.
pub trait Backend: Enqueue + Claim + Complete + OrderBarrier + Inspect + Admin + Schedules {}

impl<T: Enqueue + Claim + Complete + OrderBarrier + Inspect + Admin + Schedules + ?Sized> Backend
    for T
{
}
