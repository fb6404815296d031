//! SPEC L5, M1, M2: reading jobs, counts and the execution log.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, AttemptRecord, Batch, BatchId, BatchProgress, Error, Inspect, JobFilter, JobId,
    JobInfo, JobPage, JobState, KeyLimits, KeyUse, LIST_SCAN, Progress, QueueStats, Result,
    RunningJob,
};

use crate::{PostgresBackend, db};

#[derive(sqlx::FromRow)]
struct JobRow {
    id: i64,
    state: String,
    payload: Vec<u8>,
    priority: i16,
    run_at: DateTime<Utc>,
    attempts: i16,
    max_attempts: i16,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i32>,
    dedupe_key: Option<String>,
    enqueued_by: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    worker: Option<String>,
    started_at: Option<DateTime<Utc>>,
    output: Option<String>,
    progress: Option<String>,
    claimed_at: Option<DateTime<Utc>>,
    limit_key: Option<String>,
    /// The jobs it runs after (SPEC D1), ascending.
    after: Vec<i64>,
    #[sqlx(flatten)]
    log: LogColumns,
}

/// A job's log as one row brings it: a column per field, an element per attempt.
#[derive(sqlx::FromRow)]
struct LogColumns {
    log_attempt: Vec<i16>,
    log_worker: Vec<String>,
    log_started_at: Vec<DateTime<Utc>>,
    log_ended_at: Vec<DateTime<Utc>>,
    log_outcome: Vec<String>,
    log_error: Vec<Option<String>>,
    log_output: Vec<Option<String>>,
    log_claimed_at: Vec<Option<DateTime<Utc>>>,
}

impl LogColumns {
    fn rows(&self) -> Vec<AttemptRow> {
        (0..self.log_attempt.len())
            .map(|i| AttemptRow {
                attempt: self.log_attempt[i],
                worker: self.log_worker[i].clone(),
                started_at: self.log_started_at[i],
                claimed_at: self.log_claimed_at[i],
                ended_at: self.log_ended_at[i],
                outcome: self.log_outcome[i].clone(),
                error: self.log_error[i].clone(),
                output: self.log_output[i].clone(),
            })
            .collect()
    }
}

struct AttemptRow {
    attempt: i16,
    worker: String,
    started_at: DateTime<Utc>,
    claimed_at: Option<DateTime<Utc>>,
    ended_at: DateTime<Utc>,
    outcome: String,
    error: Option<String>,
    output: Option<String>,
}

fn num<T: TryFrom<i64>>(v: impl Into<i64>) -> Result<T>
where
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(v.into()).map_err(Error::backend)
}

impl PostgresBackend {
    /// The ids a listing query (`$1` queue, `$2` limit) returns.
    async fn ids(&self, sql: &'static str, queue: &str, limit: u32) -> Result<Vec<i64>> {
        sqlx::query_scalar(self.sql(sql))
            .bind(queue)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(db)
    }
}

#[async_trait]
impl Inspect for PostgresBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        // The oldest due claimable job in the same pass as the counts (SPEC M1).
        let rows: Vec<(String, i64, Option<DateTime<Utc>>)> = sqlx::query_as(self.sql(
            "SELECT CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled' ELSE state END,
                    count(*),
                    min(run_at) FILTER (WHERE state IN ('ready', 'retrying') AND run_at <= now())
             FROM {s}.jobs WHERE queue = $1 GROUP BY 1
             UNION ALL
             SELECT state, count(*), NULL FROM {s}.finished WHERE queue = $1 GROUP BY 1",
        ))
        .bind(queue)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        type Settings = (
            bool,
            Option<i32>,
            Option<i32>,
            Option<i64>,
            Option<i32>,
            Option<i64>,
            DateTime<Utc>,
        );
        let settings: Option<Settings> = sqlx::query_as(self.sql(
            "SELECT paused, max_running, rate_count, rate_per_us, rate_burst, rate_tat,
                    clock_timestamp()
             FROM {s}.queues WHERE queue = $1",
        ))
        .bind(queue)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            ..QueueStats::default()
        };
        if let Some((paused, max_running, count, per, burst, tat, now)) = settings {
            stats.paused = paused;
            stats.max_running = max_running.map(num).transpose()?;
            stats.rate = stored_rate(count, per, burst);
            stats.rate_next = stats.rate.and_then(|r| {
                relayq_core::kit::rate::next_start(&r, tat, now.timestamp_micros())
                    .and_then(DateTime::from_timestamp_micros)
            });
        }
        stats.oldest_ready = rows.iter().filter_map(|r| r.2).min();
        for (state, n, _) in rows {
            *stats.counts.entry(state.parse()?).or_default() += num::<u64>(n)?;
        }
        Ok(stats)
    }

    async fn key_limits_unchecked(&self, queue: &str) -> Result<KeyLimits> {
        // One statement, one snapshot: the defaults (the row without a key), then each
        // key with running jobs, a limit or rate of its own, or under the default rate
        // one whose next start is ahead of now (SPEC K7, K14; `kit::rate::next_start`
        // with the interval rounded down, at most a few microseconds early, checked
        // exactly below), each row with the server's clock.
        type Row = (
            Option<String>,
            i64,
            Option<i32>,
            Option<i32>,
            Option<i64>,
            Option<i32>,
            Option<i64>,
            DateTime<Utc>,
        );
        let rows: Vec<Row> = sqlx::query_as(self.sql(
            "SELECT NULL, 0::bigint, key_limit, key_rate_count, key_rate_per_us,
                    key_rate_burst, NULL::bigint, now()
             FROM {s}.queues WHERE queue = $1
             UNION ALL
             (SELECT k, sum(n)::bigint, max(own), max(rc), max(rp), max(rb), max(tat), now()
              FROM (
                  SELECT limit_key AS k, count(*) AS n, NULL::int AS own, NULL::int AS rc,
                         NULL::bigint AS rp, NULL::int AS rb, NULL::bigint AS tat
                  FROM {s}.jobs
                  WHERE queue = $1 AND limit_key IS NOT NULL AND state = 'running'
                  GROUP BY limit_key
                  UNION ALL
                  SELECT limit_key, 0, max, NULL, NULL, NULL, NULL
                  FROM {s}.key_limits WHERE queue = $1
                  UNION ALL
                  SELECT r.limit_key, 0, NULL, r.rate_count, r.rate_per_us, r.rate_burst,
                         r.tat
                  FROM {s}.key_rates r
                  LEFT JOIN {s}.queues d ON d.queue = $1
                  WHERE r.queue = $1
                    AND (r.rate_count IS NOT NULL
                         OR r.tat - (d.key_rate_burst - 1)
                                    * (d.key_rate_per_us
                                       / (d.key_rate_count - d.key_rate_burst + 1))
                            > (extract(epoch FROM now()) * 1e6)::bigint)) u
              GROUP BY k ORDER BY k LIMIT $2)",
        ))
        .bind(queue)
        .bind(i64::try_from(relayq_core::KEYS_LISTED).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let mut out = KeyLimits::default();
        if let Some((None, _, default, rc, rp, rb, ..)) = rows.first() {
            out.default = default.map(num).transpose()?;
            out.default_rate = stored_rate(*rc, *rp, *rb);
        }
        for (key, running, own, rc, rp, rb, tat, now) in rows {
            let Some(key) = key else { continue };
            let own = own.map(num).transpose()?;
            let own_rate = stored_rate(rc, rp, rb);
            let rate = own_rate.or(out.default_rate);
            let rate_next = rate
                .and_then(|r| relayq_core::kit::rate::next_start(&r, tat, now.timestamp_micros()))
                .and_then(DateTime::from_timestamp_micros);
            let running = num(running)?;
            if running == 0 && own.is_none() && own_rate.is_none() && rate_next.is_none() {
                continue;
            }
            out.keys.push(KeyUse {
                key,
                running,
                own,
                limit: own.or(out.default),
                own_rate,
                rate,
                rate_next,
            });
        }
        Ok(out)
    }

    async fn queues(&self) -> Result<Vec<String>> {
        // The queues by loose index scans, one index probe per queue, not a read of
        // every job: `jobs` has no index on `queue` alone, only partial ones, so each
        // scan names its index's predicate (parked jobs' queues have key limits, and
        // `queues` lists them) (without one, `min(queue)` read the whole
        // table: 0.6 s at 1,000,000 jobs). Ready and retrying jobs are in jobs_claim,
        // running ones in jobs_running; a job blocked behind its group shares its
        // queue with the group's running or retrying holder, and one blocked by its
        // stage has a batch, which `batches` lists. Finished jobs: finished_queue.
        sqlx::query_scalar(self.sql(
            "WITH RECURSIVE c(name) AS (
                 SELECT (SELECT min(queue) FROM {s}.jobs
                         WHERE state IN ('ready', 'retrying') AND NOT parked)
                 UNION ALL
                 SELECT (SELECT min(queue) FROM {s}.jobs
                         WHERE state IN ('ready', 'retrying') AND NOT parked
                           AND queue > c.name)
                 FROM c WHERE c.name IS NOT NULL),
             r(name) AS (
                 SELECT (SELECT min(queue) FROM {s}.jobs WHERE state = 'running')
                 UNION ALL
                 SELECT (SELECT min(queue) FROM {s}.jobs WHERE state = 'running' AND queue > r.name)
                 FROM r WHERE r.name IS NOT NULL),
             f(name) AS (
                 SELECT (SELECT min(queue) FROM {s}.finished)
                 UNION ALL
                 SELECT (SELECT min(queue) FROM {s}.finished WHERE queue > f.name)
                 FROM f WHERE f.name IS NOT NULL)
             SELECT name FROM c WHERE name IS NOT NULL
             UNION SELECT name FROM r WHERE name IS NOT NULL
             UNION SELECT name FROM f WHERE name IS NOT NULL
             UNION SELECT queue FROM {s}.batches
             UNION SELECT queue FROM {s}.queues
                   WHERE paused OR max_running IS NOT NULL OR keyed OR rate_count IS NOT NULL
             UNION SELECT queue FROM {s}.schedules
             ORDER BY 1",
        ))
        .fetch_all(self.pool())
        .await
        .map_err(db)
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        // One statement, so one snapshot for the row (in whichever table) and its log,
        // and one round trip: the log comes as arrays, a column each. (It was a
        // REPEATABLE READ transaction of two reads, four round trips: the dashboard's
        // timeline reads a page of jobs this way.)
        let row: Option<JobRow> = sqlx::query_as(self.sql(
            "SELECT j.*,
                    ARRAY(SELECT parent_id FROM {s}.job_deps WHERE child_id = j.id
                          ORDER BY parent_id) AS after,
                    ARRAY(SELECT attempt FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_attempt,
                    ARRAY(SELECT worker FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_worker,
                    ARRAY(SELECT started_at FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_started_at,
                    ARRAY(SELECT ended_at FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_ended_at,
                    ARRAY(SELECT outcome FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_outcome,
                    ARRAY(SELECT error FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_error,
                    ARRAY(SELECT output FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_output,
                    ARRAY(SELECT claimed_at FROM {s}.attempts WHERE job_id = j.id ORDER BY seq)
                        AS log_claimed_at
             FROM (
                 SELECT id, CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled'
                                 ELSE state END AS state,
                        payload, priority, run_at, attempts, max_attempts, group_key, batch_id,
                        stage, dedupe_key, enqueued_by, created_at,
                        NULL::timestamptz AS finished_at, last_error, worker, started_at,
                        NULL AS output, progress, started_at AS claimed_at, limit_key
                 FROM {s}.jobs WHERE id = $1 AND queue = $2
                 UNION ALL
                 SELECT id, state, payload, priority, run_at, attempts, max_attempts,
                        group_key, batch_id, stage, dedupe_key, enqueued_by, created_at,
                        finished_at, last_error, worker, started_at, output, progress,
                        claimed_at, limit_key
                 FROM {s}.finished WHERE id = $1 AND queue = $2) j",
        ))
        .bind(id.0)
        .bind(queue)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let row = row.ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        let attempts: Vec<AttemptRow> = row.log.rows();
        let mut log = attempts
            .into_iter()
            .map(|a| {
                Ok(AttemptRecord {
                    attempt: num(a.attempt)?,
                    worker: a.worker,
                    started_at: a.started_at,
                    claimed_at: a.claimed_at,
                    ended_at: Some(a.ended_at),
                    outcome: a.outcome.parse()?,
                    error: a.error,
                    output: a.output,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let state: JobState = row.state.parse()?;
        match (state, row.worker) {
            // The running attempt lives on the job row until it ends.
            (JobState::Running, worker) => log.push(AttemptRecord {
                attempt: num(row.attempts)?,
                worker: worker.unwrap_or_default(),
                started_at: row.started_at.unwrap_or(row.created_at),
                claimed_at: row.claimed_at,
                ended_at: None,
                outcome: AttemptOutcome::Running,
                error: None,
                output: None,
            }),
            // The attempt that succeeded lives on the finished row (jobs finished before
            // schema version 2 have it in `attempts`, and no worker here).
            (JobState::Succeeded, Some(worker)) => log.push(AttemptRecord {
                attempt: num(row.attempts)?,
                worker,
                started_at: row.started_at.unwrap_or(row.created_at),
                claimed_at: row.claimed_at,
                ended_at: row.finished_at,
                outcome: AttemptOutcome::Succeeded,
                error: None,
                output: row.output,
            }),
            _ => {}
        }
        Ok(JobInfo {
            after: row.after.into_iter().map(JobId).collect(),
            id: JobId(row.id),
            queue: queue.to_owned(),
            state,
            payload: row.payload,
            priority: row.priority,
            run_at: row.run_at,
            attempts: num(row.attempts)?,
            max_attempts: num(row.max_attempts)?,
            group: row.group_key,
            batch: row.batch_id.map(BatchId),
            stage: row.stage,
            dedupe_key: row.dedupe_key,
            enqueued_by: row.enqueued_by,
            created_at: row.created_at,
            finished_at: row.finished_at,
            last_error: row.last_error,
            attempt_log: log,
            progress: row.progress.as_deref().and_then(Progress::from_stored),
            limit_key: row.limit_key,
        })
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        type Row = (
            i64,
            String,
            i16,
            DateTime<Utc>,
            DateTime<Utc>,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx::query_as(self.sql(
            "SELECT id, worker, attempts, started_at, lease_expires_at, progress FROM {s}.jobs
                 WHERE queue = $1 AND state = 'running' ORDER BY id",
        ))
        .bind(queue)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(
                |(id, worker, attempt, started_at, lease_expires_at, progress)| {
                    Ok(RunningJob {
                        id: JobId(id),
                        worker,
                        attempt: num(attempt)?,
                        started_at,
                        lease_expires_at,
                        progress: progress.as_deref().and_then(Progress::from_stored),
                    })
                },
            )
            .collect()
    }

    /// Through the group's live jobs (`jobs_holder`).
    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        let id: Option<i64> = sqlx::query_scalar(self.sql(
            "SELECT id FROM {s}.jobs
             WHERE queue = $1 AND group_key = $2
               AND state IN ('ready', 'running', 'retrying') AND state <> 'ready'
             LIMIT 1",
        ))
        .bind(queue)
        .bind(group)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        Ok(id.map(JobId))
    }

    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        let ids = self
            .ids(
                "SELECT id FROM {s}.batches WHERE queue = $1 ORDER BY id DESC LIMIT $2",
                queue,
                limit,
            )
            .await?;
        relayq_core::listing::batches(self, queue, ids).await
    }

    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        // The batch's unfinished jobs through jobs_stage, its finished ones through
        // finished_batch; neither is in id order, so the page is sorted (its cost grows
        // with the batch, not with the queue).
        let ids: Option<Vec<i64>> = sqlx::query_scalar(self.sql(
            "SELECT ARRAY(SELECT id FROM (
                       SELECT id FROM {s}.jobs WHERE batch_id = $1 AND id > $3
                       UNION ALL
                       SELECT id FROM {s}.finished WHERE batch_id = $1 AND id > $3) j
                   ORDER BY id LIMIT $4)
             FROM {s}.batches WHERE id = $1 AND queue = $2",
        ))
        .bind(batch.id.0)
        .bind(&batch.queue)
        .bind(after.map_or(i64::MIN, |a| a.0))
        .bind(i64::from(limit))
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let ids = ids.ok_or_else(|| Error::not_found(batch.to_string()))?;
        Ok(ids.into_iter().map(JobId).collect())
    }

    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<relayq_core::WorkerSeen>> {
        self.seen(queue).await
    }

    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage> {
        // Both tables' primary keys read backwards and merged: the scan stops after
        // LIST_SCAN rows of the queue or once the page is full (the window and the
        // filters stream), and a state filter skips the table that cannot hold it.
        // Only the matches and the row at the scan's bound come back. The limit in
        // each branch keeps the planner on the backward index scans: without it, a
        // bound that every id passes (the first page) read the whole table and sorted
        // it (330 ms on a million jobs, against under 1 ms). Even so a custom plan
        // for stale statistics sorted the table (the statistics test); the generic
        // plan, the one a statement settles on, reads the index in every state.
        let mut tx = self
            .pool()
            .begin_with(crate::settle::GENERIC_BEGIN)
            .await
            .map_err(db)?;
        let finished = filter.state.map(JobState::is_finished);
        let rows: Vec<(i64, bool, i64)> = sqlx::query_as(self.sql(
            "SELECT id, hit, place FROM (
                 SELECT id, place,
                        -- NULL columns (no batch, no error) make NULL, not false.
                        coalesce(($3::text IS NULL OR st = $3)
                        AND ($4::bigint IS NULL OR batch_id = $4)
                        AND ($5::int IS NULL OR stage = $5)
                        AND ($6::text IS NULL OR group_key = $6)
                        AND ($7::text IS NULL OR position(convert_to($7, 'UTF8') IN payload) > 0
                             OR strpos(last_error, $7) > 0), false) AS hit
                 FROM (SELECT *, row_number() OVER (ORDER BY id DESC) AS place FROM (
                     (SELECT id, CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled'
                                      ELSE state END AS st,
                             batch_id, stage, group_key, payload, last_error
                      FROM {s}.jobs WHERE queue = $1 AND id < $2 AND $8
                      ORDER BY id DESC LIMIT $11)
                     UNION ALL
                     (SELECT id, state, batch_id, stage, group_key, payload, last_error
                      FROM {s}.finished WHERE queue = $1 AND id < $2 AND $9
                      ORDER BY id DESC LIMIT $11)
                     ORDER BY id DESC LIMIT $11) scan) numbered) w
             WHERE hit OR place = $11 ORDER BY id DESC LIMIT $10",
        ))
        .bind(queue)
        .bind(before.map_or(i64::MAX, |b| b.0))
        .bind(filter.state.map(JobState::as_str))
        .bind(filter.batch.map(|b| b.0))
        .bind(filter.stage)
        .bind(filter.group.as_deref())
        .bind(filter.text.as_deref())
        .bind(finished != Some(true))
        .bind(finished != Some(false))
        .bind(i64::from(limit) + 1)
        .bind(i64::from(LIST_SCAN))
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(JobPage::from_scan(rows, limit))
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        let ids = self
            .ids(
                "SELECT id FROM {s}.finished WHERE queue = $1 AND state = 'dead'
                 ORDER BY id LIMIT $2",
                queue,
                limit,
            )
            .await?;
        relayq_core::listing::jobs(self, queue, ids).await
    }
}

/// The rate stored in a queue's row, if it has one.
pub(crate) fn stored_rate(
    count: Option<i32>,
    per_us: Option<i64>,
    burst: Option<i32>,
) -> Option<relayq_core::Rate> {
    relayq_core::kit::rate::stored(count.map(i64::from), per_us, burst.map(i64::from))
}
