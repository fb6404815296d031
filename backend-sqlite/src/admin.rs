//! SPEC C6, B7, M2, M3: operating queues.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use relayq_core::{
    Admin, AttemptOutcome, Batch, Error, EventKind, JobId, JobState, Maintenance, QueueUpdate,
    Rate, Result, cancelled_by, kit,
};

use crate::{Conn, Ended, SqliteBackend, claim, db, log_attempt, promote, us};

/// The execution log of the jobs [`PRUNE_JOBS`] deletes.
///
/// Analyzed with a few attempts logged, SQLite scanned the whole log and tested each
/// row against the list (`SCAN relayq_attempts`, tests/statistics.rs). `INDEXED BY`
/// makes it probe the log's index per job instead in every state the test builds.
/// It is a weaker pin than the claim's: `INDEXED BY` rules out the table scan, not a
/// scan of the whole index, which SQLite's IN-versus-scan rule could still pick if
/// the statistics said the log was smaller than the list; the test would show it.
pub(crate) const PRUNE_ATTEMPTS: &str = "DELETE FROM relayq_attempts INDEXED BY relayq_attempts_job
    WHERE job_id IN (
    SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_state WHERE queue = ?1
      AND state IN ('succeeded', 'dead', 'cancelled') AND finished_at <= ?2)";

/// The edges of jobs finished before the retention cutoff (SPEC D), as
/// [`PRUNE_ATTEMPTS`] their log: a child's edges go with it. A parent pruned before its
/// child leaves the edge, which nothing reads but the child's `after`.
pub(crate) const PRUNE_EDGES: &str = "DELETE FROM relayq_job_deps INDEXED BY relayq_job_deps_child
    WHERE child_id IN (
    SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_state WHERE queue = ?1
      AND state IN ('succeeded', 'dead', 'cancelled') AND finished_at <= ?2)";

/// Jobs finished before the retention cutoff, through the one index that holds
/// finished jobs by queue (pinned, so no statistics can trade it for a scan).
pub(crate) const PRUNE_JOBS: &str =
    "DELETE FROM relayq_jobs INDEXED BY relayq_jobs_state WHERE queue = ?1
    AND state IN ('succeeded', 'dead', 'cancelled') AND finished_at <= ?2";

/// Sealed batches with no job left. It scans `relayq_batches`, which has no index on
/// its queue: one row per batch not yet pruned, a few per thousand jobs, read once
/// per maintenance pass, never per claim or settle; each row's check is one probe of
/// `relayq_jobs_batch`.
pub(crate) const PRUNE_BATCHES: &str = "DELETE FROM relayq_batches WHERE queue = ?1 AND sealed = 1
    AND NOT EXISTS (SELECT 1 FROM relayq_jobs WHERE batch_id = relayq_batches.id)";

/// The value of a key under the default key rate that lies in the past, and no wake
/// time: the same as no value (`kit::rate` starts from now either way), so the row
/// goes, and keys that never start again leave nothing behind (SPEC K12).
pub(crate) const PRUNE_KEY_RATES: &str = "DELETE FROM relayq_key_rates
    WHERE queue = ?1 AND rate_count IS NULL AND wake_at IS NULL
      AND (tat IS NULL OR tat <= ?2)";

/// The queue's settings row, made if missing.
const QUEUE_ROW: &str = "INSERT INTO relayq_queues (queue) VALUES (?1) ON CONFLICT DO NOTHING";

/// The parked jobs of key `?2` (every key's when NULL) back in the claim index, after a
/// change of key limits or rates: the next claim parks again those still held.
const UNPARK_KEYS: &str = "UPDATE relayq_jobs INDEXED BY relayq_jobs_parked SET parked = 0
    WHERE queue = ?1 AND parked = 1 AND state IN ('ready', 'retrying')
      AND (?2 IS NULL OR limit_key = ?2)";

impl SqliteBackend {
    /// SPEC B9: up to 100 unfinished jobs of no batch up to `newest`, last in claim
    /// order first (so that within a step no cancel hands a group on to a job still to
    /// be cancelled), in one transaction; `None` once none is left.
    async fn purge_step(&self, queue: &str, newest: i64) -> Result<Option<u64>> {
        let (mut tx, now) = self.write().await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM relayq_jobs
             WHERE queue = ?1 AND state IN ('ready', 'blocked', 'running', 'retrying')
               AND batch_id IS NULL AND id <= ?2
             ORDER BY priority DESC, run_at DESC, id DESC LIMIT 100",
        )
        .bind(queue)
        .bind(newest)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        if ids.is_empty() {
            return Ok(None);
        }
        let mut cancelled = 0;
        for &id in &ids {
            cancelled += u64::from(cancel(&mut tx, queue, id, now, cancelled_by::PURGE).await?);
        }
        tx.commit().await.map_err(db)?;
        if cancelled > 0 {
            self.notify(queue, EventKind::Revoked);
            self.notify(queue, EventKind::Finished);
        }
        Ok(Some(cancelled))
    }

    async fn set_queue(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        let (mut tx, _) = self.write().await?;
        let max = update.max_running;
        let rate = update.rate.flatten();
        // A new rate starts afresh (SPEC K8): its next start is cleared with it; the
        // same rate set again keeps it. (Every expression reads the row as it was.)
        sqlx::query(
            "INSERT INTO relayq_queues (queue, paused, max_running, rate_count, rate_per_us,
                                        rate_burst)
             VALUES (?1, COALESCE(?2, 0), ?4, ?6, ?7, ?8)
             ON CONFLICT (queue) DO UPDATE SET
                 paused = COALESCE(?2, paused),
                 max_running = CASE WHEN ?3 THEN ?4 ELSE max_running END,
                 rate_count = CASE WHEN ?5 THEN ?6 ELSE rate_count END,
                 rate_per_us = CASE WHEN ?5 THEN ?7 ELSE rate_per_us END,
                 rate_burst = CASE WHEN ?5 THEN ?8 ELSE rate_burst END,
                 rate_tat = CASE WHEN ?5 AND (rate_count IS NOT ?6 OR rate_per_us IS NOT ?7
                                              OR rate_burst IS NOT ?8)
                                 THEN NULL ELSE rate_tat END",
        )
        .bind(queue)
        .bind(update.paused)
        .bind(max.is_some())
        .bind(max.flatten().map(i64::from))
        .bind(update.rate.is_some())
        .bind(rate.map(|r| i64::from(r.count)))
        .bind(rate.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX)))
        .bind(rate.map(|r| i64::from(r.burst)))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.notify(queue, EventKind::Ready);
        Ok(())
    }
}

#[async_trait]
impl Admin for SqliteBackend {
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        self.set_queue(queue, update).await
    }

    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        let (mut tx, _) = self.write().await?;
        let limit = limit.map(i64::from);
        // The queue's row tells its claims to count keys (`claim::QUEUE_SETTINGS`).
        sqlx::query(QUEUE_ROW)
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        match key {
            None => sqlx::query(
                "INSERT INTO relayq_queues (queue, key_limit) VALUES (?1, ?2)
                 ON CONFLICT (queue) DO UPDATE SET key_limit = ?2",
            )
            .bind(queue)
            .bind(limit),
            Some(key) if limit.is_some() => sqlx::query(
                "INSERT INTO relayq_key_limits (queue, limit_key, max) VALUES (?1, ?2, ?3)
                 ON CONFLICT (queue, limit_key) DO UPDATE SET max = ?3",
            )
            .bind(queue)
            .bind(key)
            .bind(limit),
            Some(key) => {
                sqlx::query("DELETE FROM relayq_key_limits WHERE queue = ?1 AND limit_key = ?2")
                    .bind(queue)
                    .bind(key)
            }
        }
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        // Every parked job of the queue goes back to the claim index: the next claim
        // parks again those whose key is still full (SPEC K3).
        sqlx::query(UNPARK_KEYS)
            .bind(queue)
            .bind(None::<&str>)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.notify(queue, EventKind::Ready);
        Ok(())
    }

    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<Rate>,
    ) -> Result<()> {
        let (mut tx, _) = self.write().await?;
        let cols = |r: Option<Rate>| {
            (
                r.map(|r| i64::from(r.count)),
                r.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX)),
                r.map(|r| i64::from(r.burst)),
            )
        };
        let (count, per, burst) = cols(rate);
        type Stored = (Option<i64>, Option<i64>, Option<i64>);
        let was: Stored = match key {
            None => sqlx::query_as(
                "SELECT key_rate_count, key_rate_per_us, key_rate_burst
                 FROM relayq_queues WHERE queue = ?1",
            )
            .bind(queue),
            Some(key) => sqlx::query_as(
                "SELECT rate_count, rate_per_us, rate_burst FROM relayq_key_rates
                 WHERE queue = ?1 AND limit_key = ?2",
            )
            .bind(queue)
            .bind(key),
        }
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .unwrap_or_default();
        // The same rate set again keeps its state (SPEC K12).
        if was == (count, per, burst) {
            tx.commit().await.map_err(db)?;
            return Ok(());
        }
        // The queue's row tells its claims to judge key rates (`claim::QUEUE_SETTINGS`).
        sqlx::query(QUEUE_ROW)
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        match key {
            // A new default starts afresh for every key under it: their rows go.
            None => {
                sqlx::query(
                    "INSERT INTO relayq_queues (queue, key_rate_count, key_rate_per_us,
                                                key_rate_burst)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (queue) DO UPDATE SET key_rate_count = ?2,
                         key_rate_per_us = ?3, key_rate_burst = ?4",
                )
                .bind(queue)
                .bind(count)
                .bind(per)
                .bind(burst)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
                sqlx::query("DELETE FROM relayq_key_rates WHERE queue = ?1 AND rate_count IS NULL")
                    .bind(queue)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            // A key's own rate starts afresh; lifted, the key starts afresh under the
            // default, if there is one.
            Some(key) if rate.is_some() => {
                sqlx::query(
                    "INSERT INTO relayq_key_rates (queue, limit_key, rate_count, rate_per_us,
                                                   rate_burst)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (queue, limit_key) DO UPDATE SET rate_count = ?3,
                         rate_per_us = ?4, rate_burst = ?5, tat = NULL, wake_at = NULL",
                )
                .bind(queue)
                .bind(key)
                .bind(count)
                .bind(per)
                .bind(burst)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            Some(key) => {
                sqlx::query("DELETE FROM relayq_key_rates WHERE queue = ?1 AND limit_key = ?2")
                    .bind(queue)
                    .bind(key)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
        }
        // The parked jobs it may concern go back to the claim index; the next claim
        // parks again those still held (SPEC K3, K12).
        sqlx::query(UNPARK_KEYS)
            .bind(queue)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.notify(queue, EventKind::Ready);
        Ok(())
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        let (mut tx, now) = self.write().await?;
        let changed = cancel(&mut tx, queue, id.0, now, cancelled_by::JOB).await?;
        tx.commit().await.map_err(db)?;
        if changed {
            self.notify(queue, EventKind::Revoked);
            self.notify(queue, EventKind::Finished);
            self.notify(queue, EventKind::Ready);
        }
        Ok(changed)
    }

    /// Each batch in a transaction of its own, then the jobs of no batch by the
    /// hundred, so the write lock is never held for long; only jobs up to the newest
    /// id at the start, so a steady stream of enqueues cannot keep it going.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT max(id) FROM relayq_jobs WHERE queue = ?1")
                .bind(queue)
                .fetch_one(self.pool())
                .await
                .map_err(db)?;
        let Some(newest) = newest else { return Ok(0) };
        let batches: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT batch_id FROM relayq_jobs
             WHERE queue = ?1 AND state IN ('ready', 'blocked', 'running', 'retrying')
               AND batch_id IS NOT NULL AND id <= ?2",
        )
        .bind(queue)
        .bind(newest)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let batch = |b: Batch| async move { self.cancel_batch_as(&b, cancelled_by::PURGE).await };
        kit::purge::purge(queue, batches, batch, || self.purge_step(queue, newest)).await
    }

    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        self.cancel_batch_as(batch, cancelled_by::BATCH).await
    }
    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let (mut tx, _) = self.write().await?;
        // One job at a time, each found by its key, and its log by the log's index:
        // a list in one statement let stale statistics read the whole queue's state
        // index instead (over 350,000 steps for five jobs in the statistics test).
        let mut deleted = 0;
        for id in ids {
            let gone = sqlx::query(
                "DELETE FROM relayq_jobs WHERE id = ?1 AND queue = ?2
                   AND state IN ('succeeded', 'dead', 'cancelled')",
            )
            .bind(id.0)
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
            if gone > 0 {
                for sql in [
                    "DELETE FROM relayq_attempts WHERE job_id = ?1",
                    "DELETE FROM relayq_job_deps WHERE child_id = ?1",
                ] {
                    sqlx::query(sql)
                        .bind(id.0)
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                }
                deleted += gone;
            }
        }
        tx.commit().await.map_err(db)?;
        Ok(deleted)
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let (mut tx, now) = self.write().await?;
        let now = us(now);
        // One job at a time by its key, as delete_jobs does. A `ready` job here is never
        // blocked, and a ready grouped job is its group's next: moving its run_at
        // earlier keeps it first in its group (SPEC M10).
        let mut moved = 0;
        for id in ids {
            moved += sqlx::query(
                "UPDATE relayq_jobs SET run_at = ?3
                 WHERE id = ?1 AND queue = ?2 AND state IN ('ready', 'retrying')
                   AND run_at > ?3",
            )
            .bind(id.0)
            .bind(queue)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        }
        tx.commit().await.map_err(db)?;
        if moved > 0 {
            self.notify(queue, EventKind::Ready);
        }
        Ok(moved)
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let wanted = ids.map(|ids| {
            let list: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
            format!("[{}]", list.join(","))
        });
        let (mut tx, now) = self.write().await?;
        // Jobs of a batch stay dead: reviving one after later stages started would break
        // the order barrier. So does a job whose dedupe key another job now holds.
        let dead: Vec<(i64, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT id, group_key, dedupe_key FROM relayq_jobs j
             WHERE queue = ?1 AND state = 'dead' AND batch_id IS NULL AND attempts < 32767
               AND (?2 IS NULL OR id IN (SELECT value FROM json_each(?2)))
               AND (dedupe_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM relayq_jobs o WHERE o.queue = j.queue
                      AND o.dedupe_key = j.dedupe_key
                      AND o.state IN ('ready', 'blocked', 'running', 'retrying')))
             ORDER BY id",
        )
        .bind(queue)
        .bind(wanted)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let now = us(now);
        // Two dead jobs may share a dedupe key: only the first of them comes back.
        let mut keys = std::collections::HashSet::new();
        let mut revived = 0;
        for (id, group, key) in &dead {
            if key.as_ref().is_some_and(|k| !keys.insert(k.clone())) {
                continue;
            }
            revived += 1;
            sqlx::query(
                // Attempts go on counting and max_attempts grows by the enqueued
                // budget (SPEC M2).
                "UPDATE relayq_jobs SET state = ?2, finished_at = NULL, run_at = ?3,
                        max_attempts = min(32767, attempts + coalesce(budget, max_attempts)),
                        budget = coalesce(budget, max_attempts)
                 WHERE id = ?1",
            )
            .bind(id)
            .bind(if group.is_some() { "blocked" } else { "ready" })
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if let Some(group) = group {
                promote::settle_group(&mut tx, queue, group).await?;
            }
        }
        tx.commit().await.map_err(db)?;
        self.notify(queue, EventKind::Ready);
        Ok(revived)
    }

    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        let (mut tx, now) = self.write().await?;
        let cutoff = TimeDelta::from_std(retention)
            .ok()
            .and_then(|r| now.checked_sub_signed(r))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let (requeued, dead) = claim::expire(&mut tx, queue, now).await?;
        for sql in [PRUNE_ATTEMPTS, PRUNE_EDGES] {
            sqlx::query(sql)
                .bind(queue)
                .bind(us(cutoff))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        let pruned = sqlx::query(PRUNE_JOBS)
            .bind(queue)
            .bind(us(cutoff))
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        sqlx::query(PRUNE_BATCHES)
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(PRUNE_KEY_RATES)
            .bind(queue)
            .bind(us(now))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        if requeued + dead > 0 {
            self.notify(queue, EventKind::Finished);
            self.notify(queue, EventKind::Ready);
        }
        Ok(Maintenance {
            requeued,
            dead,
            pruned,
        })
    }
}

#[derive(sqlx::FromRow)]
struct Current {
    state: String,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    attempts: i64,
    worker: Option<String>,
    started_at: Option<i64>,
}

impl SqliteBackend {
    /// SPEC B7: seals the batch and cancels its unfinished jobs, highest stage first;
    /// `why` goes to the log of each running attempt it cuts short.
    async fn cancel_batch_as(&self, batch: &Batch, why: &str) -> Result<u64> {
        let (mut tx, now) = self.write().await?;
        let found =
            sqlx::query("UPDATE relayq_batches SET sealed = 1 WHERE id = ?1 AND queue = ?2")
                .bind(batch.id.0)
                .bind(&batch.queue)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
        if found == 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        // Highest stage first, so cancelling a stage never promotes the next one.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM relayq_jobs WHERE batch_id = ?1
               AND state IN ('ready', 'blocked', 'running', 'retrying')
             ORDER BY stage DESC, id DESC",
        )
        .bind(batch.id.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        // Every job listed is unfinished and ends cancelled: by its own cancel, or by
        // that of a job it runs after (SPEC D4), which reaches it first. All count.
        let n = ids.len() as u64;
        for id in ids {
            cancel(&mut tx, &batch.queue, id, now, why).await?;
        }
        tx.commit().await.map_err(db)?;
        // Cancelling may hand a group to a job outside the batch.
        if n > 0 {
            self.notify(&batch.queue, EventKind::Revoked);
        }
        self.notify(&batch.queue, EventKind::Finished);
        self.notify(&batch.queue, EventKind::Ready);
        Ok(n)
    }
}

/// SPEC B7: cancels one job inside the caller's transaction; false if already finished.
/// `why` goes to the log of the attempt it cuts short.
async fn cancel(c: &mut Conn, queue: &str, id: i64, now: DateTime<Utc>, why: &str) -> Result<bool> {
    let row: Option<Current> = sqlx::query_as(
        "SELECT state, group_key, batch_id, stage, attempts, worker, started_at
         FROM relayq_jobs WHERE id = ?1 AND queue = ?2",
    )
    .bind(id)
    .bind(queue)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    let row = row.ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
    let state: JobState = row.state.parse()?;
    if state.is_finished() {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE relayq_jobs SET state = 'cancelled', finished_at = ?2,
             lease_token = NULL, lease_expires_at = NULL
         WHERE id = ?1",
    )
    .bind(id)
    .bind(us(now))
    .execute(&mut *c)
    .await
    .map_err(db)?;
    if state == JobState::Running {
        let worker = row.worker.as_deref().unwrap_or_default();
        let started = row.started_at.unwrap_or_default();
        let ended = Ended {
            job: id,
            attempt: row.attempts,
            worker,
            started_at: started,
            claimed_at: started,
            ended_at: now,
            outcome: AttemptOutcome::Cancelled,
            error: Some(why),
            output: None,
        };
        log_attempt(c, ended).await?;
    }
    let finished = promote::Finished {
        id,
        queue,
        group: row.group_key.as_deref(),
        batch: row.batch_id,
        stage: row.stage,
        state: JobState::Cancelled,
    };
    promote::on_finish(c, &finished, now).await?;
    Ok(true)
}
