//! SPEC L5, M1, M2: reading jobs, counts and the execution log.

use async_trait::async_trait;
use chrono::Utc;
use futures::TryStreamExt;
use relayq_core::{
    AttemptOutcome, AttemptRecord, Batch, BatchId, BatchProgress, Error, Inspect, JobFilter, JobId,
    JobInfo, JobPage, JobState, KeyLimits, KeyUse, LIST_SCAN, Progress, QueueStats, Result,
    RunningJob,
};

use crate::{SqliteBackend, at, db, us};

#[derive(sqlx::FromRow)]
struct JobRow {
    id: i64,
    state: String,
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

fn num<T: TryFrom<i64>>(v: i64) -> Result<T>
where
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(v).map_err(Error::backend)
}

impl SqliteBackend {
    /// The ids a listing query (`?1` queue, `?2` limit) returns.
    async fn ids(&self, sql: &'static str, queue: &str, limit: u32) -> Result<Vec<i64>> {
        sqlx::query_scalar(sql)
            .bind(queue)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(db)
    }
}

#[async_trait]
impl Inspect for SqliteBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        // The oldest due claimable job in the same pass as the counts (SPEC M1).
        let rows: Vec<(String, bool, i64, Option<i64>)> = sqlx::query_as(
            "SELECT state, state = 'ready' AND run_at > ?2, COUNT(*),
                    MIN(CASE WHEN state IN ('ready', 'retrying') AND run_at <= ?2
                             THEN run_at END)
             FROM relayq_jobs WHERE queue = ?1 GROUP BY 1, 2",
        )
        .bind(queue)
        .bind(us(Utc::now()))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        type Settings = (
            bool,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let settings: Option<Settings> = sqlx::query_as(
            "SELECT paused, max_running, rate_count, rate_per_us, rate_burst, rate_tat
             FROM relayq_queues WHERE queue = ?1",
        )
        .bind(queue)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let (paused, max_running, count, per, burst, tat) =
            settings.unwrap_or((false, None, None, None, None, None));
        let rate = relayq_core::kit::rate::stored(count, per, burst);
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            paused,
            max_running: max_running.map(num).transpose()?,
            rate,
            rate_next: rate.and_then(|r| {
                relayq_core::kit::rate::next_start(&r, tat, Utc::now().timestamp_micros())
                    .map(crate::at)
            }),
            ..QueueStats::default()
        };
        stats.oldest_ready = rows.iter().filter_map(|r| r.3).min().map(crate::at);
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
        // The jobs' queues by a loose index scan: one index probe per queue, not a read
        // of every job.
        sqlx::query_scalar(
            "WITH RECURSIVE q(name) AS (
                 SELECT (SELECT min(queue) FROM relayq_jobs)
                 UNION ALL
                 SELECT (SELECT min(queue) FROM relayq_jobs WHERE queue > q.name)
                 FROM q WHERE q.name IS NOT NULL)
             SELECT name FROM q WHERE name IS NOT NULL
             UNION SELECT queue FROM relayq_batches
             UNION SELECT queue FROM relayq_queues
                   WHERE paused OR max_running IS NOT NULL OR key_limit IS NOT NULL
                      OR rate_count IS NOT NULL OR key_rate_count IS NOT NULL
             UNION SELECT queue FROM relayq_key_limits
             UNION SELECT queue FROM relayq_key_rates WHERE rate_count IS NOT NULL
             UNION SELECT queue FROM relayq_schedules
             ORDER BY 1",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db)
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        // One read transaction: in WAL mode a single snapshot of row and log.
        let mut tx = self.pool().begin().await.map_err(db)?;
        let row: Option<JobRow> = sqlx::query_as(
            "SELECT id, state, payload, priority, run_at, attempts, max_attempts, group_key,
                    batch_id, stage, dedupe_key, enqueued_by, created_at, finished_at,
                    last_error, worker, started_at, progress, limit_key
             FROM relayq_jobs WHERE id = ?1 AND queue = ?2",
        )
        .bind(id.0)
        .bind(queue)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let row = row.ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        let attempts: Vec<AttemptRow> = sqlx::query_as(
            "SELECT attempt, worker, started_at, ended_at, outcome, error, output, claimed_at
             FROM relayq_attempts WHERE job_id = ?1 ORDER BY id",
        )
        .bind(id.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let after: Vec<i64> = sqlx::query_scalar(
            "SELECT parent_id FROM relayq_job_deps WHERE child_id = ?1 ORDER BY parent_id",
        )
        .bind(id.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
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
        if state == JobState::Ready && at(row.run_at) > Utc::now() {
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
        let now = Utc::now().timestamp_micros();
        let mut tx = self.pool().begin().await.map_err(db)?;
        type Defaults = (Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let (default, count, per, burst): Defaults = sqlx::query_as(
            "SELECT key_limit, key_rate_count, key_rate_per_us, key_rate_burst
             FROM relayq_queues WHERE queue = ?1",
        )
        .bind(queue)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .unwrap_or_default();
        // Keys with running jobs, a limit or rate of their own, or under the default
        // rate one whose next start is ahead of now (SPEC K7, K14): `kit::rate::
        // next_start` with the interval rounded down, so at most a few microseconds
        // early, and checked exactly below.
        type Row = (
            String,
            i64,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT k, SUM(n), MAX(own), MAX(rc), MAX(rp), MAX(rb), MAX(tat) FROM (
                 SELECT limit_key AS k, COUNT(*) AS n, NULL AS own, NULL AS rc, NULL AS rp,
                        NULL AS rb, NULL AS tat
                 FROM relayq_jobs INDEXED BY relayq_jobs_key_running
                 WHERE queue = ?1 AND limit_key IS NOT NULL AND state = 'running'
                 GROUP BY limit_key
                 UNION ALL
                 SELECT limit_key, 0, max, NULL, NULL, NULL, NULL
                 FROM relayq_key_limits WHERE queue = ?1
                 UNION ALL
                 SELECT limit_key, 0, NULL, rate_count, rate_per_us, rate_burst, tat
                 FROM relayq_key_rates
                 WHERE queue = ?1
                   AND (rate_count IS NOT NULL
                        OR tat - (?4 - 1) * (?5 / (?6 - ?4 + 1)) > ?3))
             GROUP BY k ORDER BY k LIMIT ?2",
        )
        .bind(queue)
        .bind(i64::try_from(relayq_core::KEYS_LISTED).unwrap_or(i64::MAX))
        .bind(now)
        .bind(burst)
        .bind(per)
        .bind(count)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        let default = default.map(num).transpose()?;
        let default_rate = relayq_core::kit::rate::stored(count, per, burst);
        let mut keys = Vec::with_capacity(rows.len());
        for (key, running, own, rc, rp, rb, tat) in rows {
            let own = own.map(num).transpose()?;
            let own_rate = relayq_core::kit::rate::stored(rc, rp, rb);
            let rate = own_rate.or(default_rate);
            let rate_next = rate
                .and_then(|r| relayq_core::kit::rate::next_start(&r, tat, now))
                .and_then(chrono::DateTime::from_timestamp_micros);
            let running = num(running)?;
            if running == 0 && own.is_none() && own_rate.is_none() && rate_next.is_none() {
                continue;
            }
            keys.push(KeyUse {
                key,
                running,
                own,
                limit: own.or(default),
                own_rate,
                rate,
                rate_next,
            });
        }
        Ok(KeyLimits {
            default,
            default_rate,
            keys,
        })
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        let rows: Vec<(i64, String, i64, i64, i64, Option<String>)> = sqlx::query_as(
            "SELECT id, worker, attempts, started_at, lease_expires_at, progress FROM relayq_jobs
             WHERE queue = ?1 AND state = 'running' ORDER BY id",
        )
        .bind(queue)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(|(id, worker, attempt, started, expires, progress)| {
                Ok(RunningJob {
                    id: JobId(id),
                    worker,
                    attempt: num(attempt)?,
                    started_at: at(started),
                    lease_expires_at: at(expires),
                    progress: progress.as_deref().and_then(Progress::from_stored),
                })
            })
            .collect()
    }

    /// The statement a group's settle asks, through the group's live jobs.
    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        let id: Option<i64> = sqlx::query_scalar(crate::promote::GROUP_BUSY)
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
                "SELECT id FROM relayq_batches WHERE queue = ?1 ORDER BY id DESC LIMIT ?2",
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
        let mut tx = self.pool().begin().await.map_err(db)?;
        let known: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM relayq_batches WHERE id = ?1 AND queue = ?2")
                .bind(batch.id.0)
                .bind(&batch.queue)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        if known.is_none() {
            return Err(Error::not_found(batch.to_string()));
        }
        // relayq_jobs_batch holds (batch_id, rowid): the page is a range of it, in id
        // order, whatever the batch's size.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_batch
             WHERE batch_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
        )
        .bind(batch.id.0)
        .bind(after.map_or(i64::MIN, |a| a.0))
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
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
        // The rowid read backwards (NOT INDEXED: an index on `queue` would sort the
        // whole queue first), one row at a time: the reading stops once the page is
        // full, so a page of a dense listing steps through about `limit` rows, and
        // never more than LIST_SCAN. (A window function to number the rows made
        // SQLite read all LIST_SCAN first.) The needle is bound as a blob for the
        // payload, so instr compares bytes, and as text for the error.
        let mut rows = sqlx::query_as::<_, (i64, bool)>(
            "SELECT id,
                    coalesce((?3 IS NULL OR (CASE WHEN state = 'ready' AND run_at > ?9
                                                  THEN 'scheduled' ELSE state END) = ?3)
                    AND (?4 IS NULL OR batch_id = ?4)
                    AND (?5 IS NULL OR stage = ?5)
                    AND (?6 IS NULL OR group_key = ?6)
                    AND (?7 IS NULL OR instr(payload, ?7) > 0
                         OR instr(last_error, ?8) > 0), 0)
             FROM relayq_jobs NOT INDEXED
             WHERE queue = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?10",
        )
        .bind(queue)
        .bind(before.map_or(i64::MAX, |b| b.0))
        .bind(filter.state.map(JobState::as_str))
        .bind(filter.batch.map(|b| b.0))
        .bind(filter.stage)
        .bind(filter.group.as_deref())
        .bind(filter.text.as_ref().map(|t| t.as_bytes().to_vec()))
        .bind(filter.text.as_deref())
        .bind(us(Utc::now()))
        .bind(i64::from(LIST_SCAN))
        .fetch(self.pool());
        let mut scan = Vec::new();
        let mut hits = 0;
        while let Some((id, hit)) = rows.try_next().await.map_err(db)? {
            hits += u32::from(hit);
            scan.push((id, hit, i64::try_from(scan.len() + 1).unwrap_or(i64::MAX)));
            if hits >= limit {
                break;
            }
        }
        Ok(JobPage::from_scan(scan, limit))
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        let ids = self
            .ids(
                "SELECT id FROM relayq_jobs WHERE queue = ?1 AND state = 'dead' ORDER BY id LIMIT ?2",
                queue,
                limit,
            )
            .await?;
        relayq_core::listing::jobs(self, queue, ids).await
    }
}
