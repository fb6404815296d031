//! SPEC L5, M1, M2, M4, M5, M6, M7, M9: reading jobs, counts and the execution log.
//!
//! Reads take no queue lock. Where a job is `ready` but its `run_at` is ahead, it is
//! reported `scheduled`, judged on the server's clock at the statement's start
//! (`NOW(6)`, which every row of one statement shares).

use async_trait::async_trait;
use relayq_core::{
    AttemptOutcome, AttemptRecord, Batch, BatchId, BatchProgress, Error, Inspect, JobFilter, JobId,
    JobInfo, JobPage, JobState, KeyLimits, LIST_SCAN, Progress, QueueStats, Result, RunningJob,
    WorkerSeen, retry::retry_transient,
};
use sqlx::{MySql, QueryBuilder};

use crate::{MysqlBackend, at, db};

/// A queue's jobs counted by state, and whether they are `ready` jobs not yet due
/// (`scheduled`), with the oldest due claimable job's `run_at` in the same pass (SPEC
/// M1): the server's time read once, in a one-row derived table.
const QUEUE_COUNTS: &str = "SELECT state, state = 'ready' AND run_at > n.now AS future,
        COUNT(*),
        MIN(CASE WHEN state IN ('ready', 'retrying') AND run_at <= n.now THEN run_at END)
    FROM relayq_jobs,
         (SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) AS now) AS n
    WHERE queue = ? GROUP BY 1, 2";

/// A queue's settings; no row means none were ever set.
const QUEUE_SETTINGS: &str = "SELECT paused, max_running, rate_count, rate_per_us, rate_burst,
        rate_tat, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
    FROM relayq_queues WHERE queue = ?";

/// The queues in use (SPEC M4): holding a job (a loose index scan of an index that
/// starts with the queue, one probe per queue), a batch, a setting or a schedule.
/// The locked row every write makes (`lock.rs`) holds no setting until one is set,
/// and beats are not a use.
const QUEUES: &str = "SELECT DISTINCT queue FROM relayq_jobs
    UNION SELECT queue FROM relayq_batches
    UNION SELECT queue FROM relayq_queues
        WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL
    UNION SELECT queue FROM relayq_schedules
    ORDER BY 1";

/// One job by its primary key, read under a shared lock held until [`ATTEMPTS`] is
/// read: whatever ends its attempt (a settle, an expiry, a cancel) writes the row and
/// the log in one transaction, so row and log describe the same moment, as SQLite's
/// read transaction does.
const JOB: &str = "SELECT id, state, run_at > CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
        AS future, payload, priority, run_at, attempts, max_attempts, group_key, batch_id,
        stage, dedupe_key, enqueued_by, created_at, finished_at, last_error, worker,
        started_at, progress, limit_key
    FROM relayq_jobs WHERE id = ? AND queue = ? LOCK IN SHARE MODE";

/// A job's ended attempts, oldest first, through `relayq_attempts_job`.
const ATTEMPTS: &str = "SELECT attempt, worker, started_at, ended_at, outcome, error, output,
        claimed_at
    FROM relayq_attempts WHERE job_id = ? ORDER BY id";

/// A queue's running jobs, through `relayq_jobs_running`'s prefix (`running_queue`
/// is the queue of a running job only).
const RUNNING: &str = "SELECT id, worker, attempts, started_at, lease_expires_at, progress
    FROM relayq_jobs WHERE running_queue = ? ORDER BY id";

/// SPEC G2, M6: the group's running or retrying job, as promotion asks for it
/// (`promote::GROUP_BUSY`), through `relayq_jobs_holder`.
const GROUP_HOLDER: &str = "SELECT id FROM relayq_jobs
    WHERE queue = ? AND holding_group = ? AND state IN ('running', 'retrying') LIMIT 1";

/// The newest batches of a queue, through `relayq_batches_queue` read backwards.
const BATCH_IDS: &str = "SELECT id FROM relayq_batches WHERE queue = ? ORDER BY id DESC LIMIT ?";

/// Whether a batch is of the queue.
const BATCH_KNOWN: &str = "SELECT 1 FROM relayq_batches WHERE id = ? AND queue = ?";

/// SPEC M5: a page of a batch's jobs, a range of `relayq_jobs_batch` (batch, id) in id
/// order, whatever the batch's size.
const BATCH_JOB_IDS: &str =
    "SELECT id FROM relayq_jobs WHERE batch_id = ? AND id > ? ORDER BY id LIMIT ?";

/// The oldest dead jobs of a queue.
const DEAD_IDS: &str =
    "SELECT id FROM relayq_jobs WHERE queue = ? AND state = 'dead' ORDER BY id LIMIT ?";

/// The rows a listing reads in its second and later reads at least (SPEC M7): a sparse
/// filter reaches `LIST_SCAN` in a few round trips.
const LIST_CHUNK: i64 = 256;

#[derive(sqlx::FromRow)]
struct JobRow {
    id: i64,
    state: String,
    future: bool,
    payload: Vec<u8>,
    priority: i64,
    run_at: i64,
    attempts: i64,
    max_attempts: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    dedupe_key: Option<String>,
    enqueued_by: Option<String>,
    created_at: i64,
    finished_at: Option<i64>,
    last_error: Option<String>,
    worker: Option<String>,
    started_at: Option<i64>,
    progress: Option<String>,
    limit_key: Option<String>,
}

#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt: i64,
    worker: String,
    started_at: i64,
    ended_at: i64,
    outcome: String,
    claimed_at: Option<i64>,
    error: Option<String>,
    output: Option<String>,
}

type RunningRow = (
    i64,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

fn num<T: TryFrom<i64>>(v: i64) -> Result<T>
where
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(v).map_err(Error::backend)
}

impl MysqlBackend {
    /// The ids a listing statement (queue, limit) returns.
    async fn ids(&self, sql: &'static str, queue: &str, limit: u32) -> Result<Vec<i64>> {
        sqlx::query_scalar(sql)
            .bind(queue)
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)
    }

    /// The job's row and its ended attempts, read as one moment ([`JOB`]).
    async fn job_rows(
        &self,
        queue: &str,
        id: JobId,
    ) -> Result<(JobRow, Vec<AttemptRow>, Vec<i64>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let row: Option<JobRow> = sqlx::query_as(JOB)
            .bind(id.0)
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let row = row.ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        let attempts: Vec<AttemptRow> = sqlx::query_as(ATTEMPTS)
            .bind(id.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        // The jobs it runs after (SPEC D).
        let after: Vec<i64> = sqlx::query_scalar(
            "SELECT parent_id FROM relayq_job_deps WHERE child_id = ? ORDER BY parent_id",
        )
        .bind(id.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok((row, attempts, after))
    }

    /// Up to `take` of the queue's jobs below id `below`, newest first, each with
    /// whether it matches `filter` (SPEC M7). Only the filters set are in the
    /// statement, and each match is `NULL`-safe (a job of no batch or with no error
    /// matches no such filter). The payload and the error are searched as bytes (a
    /// match of UTF-8 text in UTF-8 text starts on a character, so byte for byte is
    /// text for text), and the group compared as bytes, whatever the collation pads.
    async fn list_chunk(
        &self,
        queue: &str,
        filter: &JobFilter,
        below: i64,
        take: i64,
    ) -> Result<Vec<(i64, bool)>> {
        let mut q = QueryBuilder::<MySql>::new("SELECT id, COALESCE(TRUE");
        if let Some(state) = filter.state {
            q.push(
                " AND (CASE WHEN state = 'ready'
                    AND run_at > CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
                    THEN 'scheduled' ELSE state END) = ",
            )
            .push_bind(state.as_str());
        }
        if let Some(batch) = filter.batch {
            q.push(" AND batch_id = ").push_bind(batch.0);
        }
        if let Some(stage) = filter.stage {
            q.push(" AND stage = ").push_bind(i64::from(stage));
        }
        if let Some(group) = &filter.group {
            q.push(" AND CAST(group_key AS BINARY) = ")
                .push_bind(group.as_bytes().to_vec());
        }
        if let Some(text) = &filter.text {
            q.push(" AND (INSTR(payload, ")
                .push_bind(text.as_bytes().to_vec())
                .push(") > 0 OR INSTR(CAST(last_error AS BINARY), ")
                .push_bind(text.as_bytes().to_vec())
                .push(") > 0)");
        }
        q.push(", FALSE) FROM relayq_jobs FORCE INDEX (relayq_jobs_list) WHERE queue = ")
            .push_bind(queue)
            .push(" AND id < ")
            .push_bind(below)
            .push(" ORDER BY id DESC LIMIT ")
            .push_bind(take);
        q.build_query_as()
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)
    }
}

#[async_trait]
impl Inspect for MysqlBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        let rows: Vec<(String, bool, i64, Option<i64>)> = sqlx::query_as(QUEUE_COUNTS)
            .bind(queue)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        type Settings = (
            bool,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            i64,
        );
        let settings: Option<Settings> = sqlx::query_as(QUEUE_SETTINGS)
            .bind(queue)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        let (paused, max_running, count, per, burst, tat, now) =
            settings.unwrap_or((false, None, None, None, None, None, 0));
        let rate = relayq_core::kit::rate::stored(count, per, burst);
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            paused,
            max_running: max_running.map(num).transpose()?,
            rate,
            rate_next: rate.and_then(|r| relayq_core::kit::rate::next_start(&r, tat, now).map(at)),
            ..QueueStats::default()
        };
        stats.oldest_ready = rows.iter().filter_map(|r| r.3).min().map(at);
        for (state, future, n, _) in rows {
            let state = if future {
                JobState::Scheduled
            } else {
                state.parse()?
            };
            *stats.counts.entry(state).or_default() += num::<u64>(n)?;
        }
        Ok(stats)
    }

    async fn queues(&self) -> Result<Vec<String>> {
        sqlx::query_scalar(QUEUES)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        let (row, attempts, after) =
            retry_transient(|| self.job_rows(queue, id), crate::deadlocked).await?;
        let mut log = attempts
            .into_iter()
            .map(|a| {
                Ok(AttemptRecord {
                    attempt: num(a.attempt)?,
                    worker: a.worker,
                    started_at: at(a.started_at),
                    claimed_at: a.claimed_at.map(at),
                    ended_at: Some(at(a.ended_at)),
                    outcome: a.outcome.parse()?,
                    error: a.error,
                    output: a.output,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut state: JobState = row.state.parse()?;
        if state == JobState::Running {
            // The running attempt lives on the job row until it ends.
            log.push(AttemptRecord {
                attempt: num(row.attempts)?,
                worker: row.worker.unwrap_or_default(),
                started_at: at(row.started_at.unwrap_or(row.created_at)),
                claimed_at: row.started_at.map(at),
                ended_at: None,
                outcome: AttemptOutcome::Running,
                error: None,
                output: None,
            });
        }
        if state == JobState::Ready && row.future {
            state = JobState::Scheduled;
        }
        Ok(JobInfo {
            id: JobId(row.id),
            queue: queue.to_owned(),
            state,
            payload: row.payload,
            priority: num(row.priority)?,
            run_at: at(row.run_at),
            attempts: num(row.attempts)?,
            max_attempts: num(row.max_attempts)?,
            group: row.group_key,
            batch: row.batch_id.map(BatchId),
            stage: row.stage.map(num).transpose()?,
            dedupe_key: row.dedupe_key,
            enqueued_by: row.enqueued_by,
            created_at: at(row.created_at),
            finished_at: row.finished_at.map(at),
            last_error: row.last_error,
            attempt_log: log,
            progress: row.progress.as_deref().and_then(Progress::from_stored),
            limit_key: row.limit_key,
            after: after.into_iter().map(JobId).collect(),
        })
    }

    async fn key_limits_unchecked(&self, queue: &str) -> Result<KeyLimits> {
        self.key_limits_of(queue).await
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        let rows: Vec<RunningRow> = sqlx::query_as(RUNNING)
            .bind(queue)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        rows.into_iter()
            .map(|(id, worker, attempt, started, expires, progress)| {
                Ok(RunningJob {
                    id: JobId(id),
                    worker: worker.unwrap_or_default(),
                    attempt: num(attempt)?,
                    started_at: at(started.unwrap_or_default()),
                    lease_expires_at: at(expires.unwrap_or_default()),
                    progress: progress.as_deref().and_then(Progress::from_stored),
                })
            })
            .collect()
    }

    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        let id: Option<i64> = sqlx::query_scalar(GROUP_HOLDER)
            .bind(queue)
            .bind(group)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        Ok(id.map(JobId))
    }

    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        let ids = self.ids(BATCH_IDS, queue, limit).await?;
        relayq_core::listing::batches(self, queue, ids).await
    }

    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        let known: Option<i64> = sqlx::query_scalar(BATCH_KNOWN)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        if known.is_none() {
            return Err(Error::not_found(batch.to_string()));
        }
        let ids: Vec<i64> = sqlx::query_scalar(BATCH_JOB_IDS)
            .bind(batch.id.0)
            .bind(after.map_or(i64::MIN, |a| a.0))
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        Ok(ids.into_iter().map(JobId).collect())
    }

    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        self.seen(queue).await
    }

    /// `relayq_jobs_list` (queue, id) read backwards in growing chunks, the index
    /// forced (a sort of the queue's jobs, which the statistics of a small table may
    /// prefer, would read every one of them): the first chunk as long as the page, so
    /// a dense listing reads about `limit` rows in one round trip; then at least
    /// [`LIST_CHUNK`], four times the last, up to `LIST_SCAN` rows in all. Reading
    /// stops once the page is full. (One statement numbering the rows with a window
    /// function reads all `LIST_SCAN` first.)
    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage> {
        let scan_max = i64::from(LIST_SCAN);
        let mut scan: Vec<(i64, bool, i64)> = Vec::new();
        let mut below = before.map_or(i64::MAX, |b| b.0);
        let mut take = i64::from(limit);
        let mut place = 0;
        let mut hits = 0;
        while place < scan_max {
            let want = take.min(scan_max - place);
            let rows = self.list_chunk(queue, filter, below, want).await?;
            let got = i64::try_from(rows.len()).unwrap_or(i64::MAX);
            for (id, hit) in rows {
                place += 1;
                hits += u32::from(hit);
                scan.push((id, hit, place));
                below = id;
                if hits >= limit {
                    return Ok(JobPage::from_scan(scan, limit));
                }
            }
            if got < want {
                break;
            }
            take = take.saturating_mul(4).max(LIST_CHUNK);
        }
        Ok(JobPage::from_scan(scan, limit))
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        let ids = self.ids(DEAD_IDS, queue, limit).await?;
        relayq_core::listing::jobs(self, queue, ids).await
    }
}
