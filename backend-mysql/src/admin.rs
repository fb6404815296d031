//! SPEC C5, C6, B6–B9, M2, M3, M8, M10: operating queues.
//!
//! Every write that changes a queue's jobs runs in `self.write(&[queue])`, which holds
//! the queue's row exclusively: nothing else changes the queue's jobs meanwhile, so a
//! transaction reads the rows it will change, then changes them by primary key (MySQL
//! has no `UPDATE ... RETURNING`, and refuses a subquery on the table it updates), and
//! promotes what that releases (`promote::Touched`) before it commits. Each
//! transaction runs again, whole, when it was a deadlock's victim or waited out a lock
//! (`retry_transient`). Key limits and key rates are in `keys.rs` and
//! `key_rates.rs`.

use std::time::Duration;

use async_trait::async_trait;
use relayq_core::{
    Admin, AttemptOutcome, Batch, Error, JobId, JobState, Maintenance, QueueUpdate, Result,
    cancelled_by, kit, retry::retry_transient,
};
use sqlx::{MySql, QueryBuilder, pool::PoolConnection};

use crate::{
    Conn, Ended, MysqlBackend, claim, db, log_attempts,
    promote::{Finished, Touched},
};

/// Pauses, resumes or limits a queue in one statement: paused (`NULL` keeps it),
/// then whether to set `max_running`, and its value. The upsert locks the queue's
/// row, so a claim in progress finishes under the old settings first.
///
/// A new rate starts afresh (SPEC K8): its next start is cleared with it; the same rate
/// set again keeps it. `rate_tat` comes first: MySQL assigns left to right, each
/// expression reading the columns set before it.
const SET_QUEUE: &str = "INSERT INTO relayq_queues
        (queue, paused, max_running, rate_count, rate_per_us, rate_burst)
    VALUES (?, COALESCE(?, FALSE), ?, ?, ?, ?)
    ON DUPLICATE KEY UPDATE
        rate_tat = IF(? AND NOT (rate_count <=> ? AND rate_per_us <=> ? AND rate_burst <=> ?),
                      NULL, rate_tat),
        rate_count = IF(?, ?, rate_count),
        rate_per_us = IF(?, ?, rate_per_us),
        rate_burst = IF(?, ?, rate_burst),
        paused = COALESCE(?, paused),
        max_running = IF(?, ?, max_running),
        changes = changes + 1";

/// A job by its primary key, as a cancel needs it; read under its queue's lock.
const JOB_LIVE: &str = "SELECT id, state, group_key, batch_id, stage, attempts, worker,
        started_at, limit_key, parked
    FROM relayq_jobs WHERE id = ? AND queue = ?";

/// SPEC B7: a batch's unfinished jobs (`relayq_jobs_stage`, whose `live_batch` holds
/// them only), highest stage first.
const BATCH_LIVE: &str = "SELECT id, state, group_key, batch_id, stage, attempts, worker,
        started_at, limit_key, parked
    FROM relayq_jobs WHERE live_batch = ? ORDER BY stage DESC, id DESC";

/// SPEC B7: seals the batch (no job joins it from now on); no row when the batch is
/// not of the queue. The connection counts rows matched, so a sealed batch counts.
const SEAL: &str = "UPDATE relayq_batches SET sealed = TRUE WHERE id = ? AND queue = ?";

/// SPEC B9: the queue's newest job when the purge starts: it purges up to it only, so
/// a steady stream of enqueues cannot keep it going.
const NEWEST: &str = "SELECT MAX(id) FROM relayq_jobs WHERE queue = ?";

/// SPEC B9: the batches with an unfinished job up to the newest.
const PURGE_BATCHES: &str = "SELECT DISTINCT batch_id FROM relayq_jobs
    WHERE queue = ? AND state IN ('ready', 'blocked', 'running', 'retrying')
      AND batch_id IS NOT NULL AND id <= ?";

/// SPEC B9: the next 100 unfinished jobs of no batch up to the newest, last in claim
/// order first.
const PURGE_LIVE: &str = "SELECT id, state, group_key, batch_id, stage, attempts, worker,
        started_at, limit_key, parked
    FROM relayq_jobs
    WHERE queue = ? AND state IN ('ready', 'blocked', 'running', 'retrying')
      AND batch_id IS NULL AND id <= ?
    ORDER BY priority DESC, run_at DESC, id DESC LIMIT 100";

/// SPEC M3: the next [`PRUNE_CHUNK`] jobs finished before the cutoff, through
/// `relayq_jobs_state` (queue, state, finished_at).
const PRUNABLE: &str = "SELECT id FROM relayq_jobs
    WHERE queue = ? AND state IN ('succeeded', 'dead', 'cancelled') AND finished_at <= ?
    LIMIT ?";

/// SPEC M3: sealed batches with no job left, read plainly and deleted by id
/// (`by_id.rs`); each batch's check is one probe of `relayq_jobs_batch`.
const PRUNE_BATCHES: &str = "SELECT id FROM relayq_batches WHERE queue = ? AND sealed
    AND NOT EXISTS (SELECT 1 FROM relayq_jobs WHERE batch_id = relayq_batches.id)";

/// SPEC M3: takes the queue's maintenance lock, if free, at once: a named lock of the
/// session (`GET_LOCK`), named after the database and the queue by a digest, since a
/// name may have at most 64 characters. 1 taken, 0 held by another session.
const TRY_MAINTAIN_LOCK: &str =
    "SELECT GET_LOCK(CONCAT('relayq_maintain.', SHA1(CONCAT(?, '/', ?))), 0)";

/// Frees [`TRY_MAINTAIN_LOCK`].
const MAINTAIN_UNLOCK: &str =
    "DO RELEASE_LOCK(CONCAT('relayq_maintain.', SHA1(CONCAT(?, '/', ?))))";

/// Ids per statement where a list of them is bound: well under the 65,535 parameters
/// of a prepared statement, and a short statement each.
const ID_CHUNK: usize = 1_000;

/// Finished jobs pruned per transaction, so that no prune holds the queue's lock for
/// long (a job has up to `max_attempts` log rows).
const PRUNE_CHUNK: u32 = 1_000;

/// An unfinished job as a cancel reads it.
#[derive(sqlx::FromRow)]
struct Live {
    id: i64,
    state: String,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    attempts: i64,
    worker: Option<String>,
    started_at: Option<i64>,
    limit_key: Option<String>,
    parked: bool,
}

/// A dead job as a retry reads it.
#[derive(sqlx::FromRow)]
struct Dead {
    id: i64,
    group_key: Option<String>,
    dedupe_key: Option<String>,
}

/// Pushes `(?, ?, ...)` binding `ids`, which are not empty.
fn push_ids(q: &mut QueryBuilder<MySql>, ids: impl IntoIterator<Item = i64>) {
    q.push("(");
    let mut list = q.separated(", ");
    for id in ids {
        list.push_bind(id);
    }
    list.push_unseparated(")");
}

/// `duration` in whole microseconds, saturating.
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// SPEC B7, B8, L5: cancels `jobs` of `queue` inside the caller's transaction, which
/// holds the queue's lock and read them unfinished: each becomes `cancelled`, a
/// running one losing its lease, its attempt logged as cancelled with `why`; what they
/// held is recorded in `touched` for the caller to promote.
async fn cancel(
    c: &mut Conn,
    queue: &str,
    jobs: &[Live],
    now: i64,
    why: &str,
    touched: &mut Touched,
) -> Result<()> {
    for chunk in jobs.chunks(ID_CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE relayq_jobs SET state = 'cancelled', lease_token = NULL,
                 lease_expires_at = NULL, finished_at = ",
        );
        q.push_bind(now).push(" WHERE id IN ");
        push_ids(&mut q, chunk.iter().map(|j| j.id));
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    let mut ended = Vec::new();
    for j in jobs {
        if j.state.parse::<JobState>()? == JobState::Running {
            let started = j.started_at.unwrap_or_default();
            ended.push(Ended {
                job: j.id,
                attempt: j.attempts,
                worker: j.worker.as_deref().unwrap_or_default(),
                started_at: started,
                claimed_at: started,
                ended_at: now,
                outcome: AttemptOutcome::Cancelled,
                error: Some(why),
                output: None,
            });
        }
    }
    for chunk in ended.chunks(ID_CHUNK) {
        log_attempts(c, chunk).await?;
    }
    for j in jobs {
        // A running keyed job frees its key's slot; an unparked waiting one may be the
        // one a freed slot put back, and passes its turn on (SPEC K2, K4).
        let state = j.state.parse::<JobState>()?;
        let waiting = matches!(state, JobState::Ready | JobState::Retrying) && !j.parked;
        if state == JobState::Running || waiting {
            crate::keys::freed(c, queue, j.limit_key.as_deref()).await?;
        }
        let finished = Finished {
            id: j.id,
            queue,
            group: j.group_key.as_deref(),
            batch: j.batch_id,
            stage: j.stage,
            state: JobState::Cancelled,
        };
        touched.finished(c, &finished, now).await?;
    }
    Ok(())
}

/// Deletes the jobs `ids` (finished, of the caller's locked queue) with their
/// execution log (SPEC M3, M8).
async fn delete(c: &mut Conn, ids: &[i64]) -> Result<u64> {
    let mut deleted = 0;
    for chunk in ids.chunks(ID_CHUNK) {
        let mut q = QueryBuilder::<MySql>::new("DELETE FROM relayq_attempts WHERE job_id IN ");
        push_ids(&mut q, chunk.iter().copied());
        q.build().execute(&mut *c).await.map_err(db)?;
        // A child's edges go with it (SPEC D). A parent deleted before its child
        // leaves the edge, which nothing reads but the child's `after`.
        let mut q = QueryBuilder::<MySql>::new("DELETE FROM relayq_job_deps WHERE child_id IN ");
        push_ids(&mut q, chunk.iter().copied());
        q.build().execute(&mut *c).await.map_err(db)?;
        let mut q = QueryBuilder::<MySql>::new("DELETE FROM relayq_jobs WHERE id IN ");
        push_ids(&mut q, chunk.iter().copied());
        deleted += q
            .build()
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
    }
    Ok(deleted)
}

/// A session's named lock (`GET_LOCK`) on a connection of the pool. Dropped without
/// [`release`](Self::release) (a pass dropped halfway), the connection is closed
/// instead of going back to the pool, which frees the lock on the server.
struct NamedLock(Option<PoolConnection<MySql>>);

impl NamedLock {
    /// Frees the lock and gives the connection back to the pool; a connection that
    /// could not free it is closed.
    async fn release(mut self, database: &str, queue: &str) {
        if let Some(mut c) = self.0.take() {
            let freed = sqlx::query(MAINTAIN_UNLOCK)
                .bind(database)
                .bind(queue)
                .execute(&mut *c)
                .await;
            if freed.is_err() {
                c.close_on_drop();
            }
        }
    }
}

impl Drop for NamedLock {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            c.close_on_drop();
        }
    }
}

impl MysqlBackend {
    /// Stores `update`'s pause and `max_running`, leaving what it does not name.
    async fn set_queue(&self, queue: &str, update: &QueueUpdate) -> Result<()> {
        let max = update.max_running.flatten().map(i64::from);
        let rate = update.rate.flatten();
        let set = update.rate.is_some();
        let count = rate.map(|r| i64::from(r.count));
        let per = rate.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX));
        let burst = rate.map(|r| i64::from(r.burst));
        sqlx::query(SET_QUEUE)
            .bind(queue)
            .bind(update.paused)
            .bind(max)
            .bind(count)
            .bind(per)
            .bind(burst)
            .bind(set)
            .bind(count)
            .bind(per)
            .bind(burst)
            .bind(set)
            .bind(count)
            .bind(set)
            .bind(per)
            .bind(set)
            .bind(burst)
            .bind(update.paused)
            .bind(update.max_running.is_some())
            .bind(max)
            .execute(&self.inner.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// SPEC B7: cancels job `id` of `queue` in one transaction; false if it was
    /// finished already. `why` goes to the log of the attempt it cuts short.
    async fn cancel_job_tx(&self, queue: &str, id: JobId, why: &str) -> Result<bool> {
        let (mut tx, now) = self.write(&[queue]).await?;
        let row: Option<Live> = sqlx::query_as(JOB_LIVE)
            .bind(id.0)
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let row = row.ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        if row.state.parse::<JobState>()?.is_finished() {
            tx.commit().await.map_err(db)?;
            return Ok(false);
        }
        let mut touched = Touched::default();
        cancel(
            &mut tx,
            queue,
            std::slice::from_ref(&row),
            now,
            why,
            &mut touched,
        )
        .await?;
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        Ok(true)
    }

    /// SPEC B7: seals the batch and cancels its unfinished jobs, highest stage first,
    /// in one transaction; `why` goes to the log of each running attempt it cuts
    /// short. Promotion runs once all are cancelled, so no later stage is released on
    /// the way, and a group may pass to a job outside the batch.
    async fn cancel_batch_tx(&self, batch: &Batch, why: &str) -> Result<u64> {
        let (mut tx, now) = self.write(&[&batch.queue]).await?;
        let found = sqlx::query(SEAL)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        if found == 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        let jobs: Vec<Live> = sqlx::query_as(BATCH_LIVE)
            .bind(batch.id.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let mut touched = Touched::default();
        cancel(&mut tx, &batch.queue, &jobs, now, why, &mut touched).await?;
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        Ok(jobs.len() as u64)
    }

    /// [`cancel_batch_tx`](Self::cancel_batch_tx), run again after a deadlock.
    async fn cancel_batch_as(&self, batch: &Batch, why: &str) -> Result<u64> {
        retry_transient(|| self.cancel_batch_tx(batch, why), crate::deadlocked).await
    }

    /// SPEC B9: cancels up to 100 unfinished jobs of no batch up to `newest`, last in
    /// claim order first, in one transaction; `None` once none is left.
    async fn purge_step_tx(&self, queue: &str, newest: i64) -> Result<Option<u64>> {
        let (mut tx, now) = self.write(&[queue]).await?;
        let jobs: Vec<Live> = sqlx::query_as(PURGE_LIVE)
            .bind(queue)
            .bind(newest)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        if jobs.is_empty() {
            tx.commit().await.map_err(db)?;
            return Ok(None);
        }
        let mut touched = Touched::default();
        cancel(
            &mut tx,
            queue,
            &jobs,
            now,
            cancelled_by::PURGE,
            &mut touched,
        )
        .await?;
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        Ok(Some(jobs.len() as u64))
    }

    /// SPEC M8: deletes the finished jobs of `queue` among `ids`, with their log.
    async fn delete_jobs_tx(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let (mut tx, _) = self.write(&[queue]).await?;
        let mut found = Vec::new();
        for chunk in ids.chunks(ID_CHUNK) {
            let mut q = QueryBuilder::<MySql>::new("SELECT id FROM relayq_jobs WHERE queue = ");
            q.push_bind(queue)
                .push(" AND state IN ('succeeded', 'dead', 'cancelled') AND id IN ");
            push_ids(&mut q, chunk.iter().map(|id| id.0));
            let some: Vec<i64> = q
                .build_query_scalar()
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?;
            found.extend(some);
        }
        let deleted = delete(&mut tx, &found).await?;
        tx.commit().await.map_err(db)?;
        Ok(deleted)
    }

    /// SPEC M10: makes the `ready` or `retrying` jobs of `queue` among `ids` whose
    /// `run_at` is ahead of the server's time due now. A `ready` job is never blocked,
    /// and a ready grouped job is its group's next: an earlier `run_at` keeps it first
    /// there.
    async fn run_now_tx(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let (mut tx, now) = self.write(&[queue]).await?;
        let mut moved = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            let mut q = QueryBuilder::<MySql>::new("UPDATE relayq_jobs SET run_at = ");
            q.push_bind(now)
                .push(" WHERE queue = ")
                .push_bind(queue)
                .push(" AND state IN ('ready', 'retrying') AND run_at > ")
                .push_bind(now)
                .push(" AND id IN ");
            push_ids(&mut q, chunk.iter().map(|id| id.0));
            moved += q
                .build()
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
        }
        tx.commit().await.map_err(db)?;
        Ok(moved)
    }

    /// SPEC M2: the dead jobs of `queue` a retry may revive (all, or those among
    /// `ids`), in id order. Jobs of a batch stay dead: reviving one after later stages
    /// started would break the order barrier. So does a job whose dedupe key an
    /// unfinished job holds (`live_dedupe`, the unique index's column).
    async fn revivable(c: &mut Conn, queue: &str, ids: Option<&[JobId]>) -> Result<Vec<Dead>> {
        let head = "SELECT id, group_key, dedupe_key FROM relayq_jobs j WHERE queue = ";
        let tail = " AND (dedupe_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM relayq_jobs o WHERE o.queue = j.queue
                  AND o.live_dedupe = j.dedupe_key))
            ORDER BY id";
        let chunks: Vec<Option<&[JobId]>> = match ids {
            None => vec![None],
            Some(ids) => ids.chunks(ID_CHUNK).map(Some).collect(),
        };
        let mut dead = Vec::new();
        for chunk in chunks {
            let mut q = QueryBuilder::<MySql>::new(head);
            q.push_bind(queue)
                .push(" AND state = 'dead' AND batch_id IS NULL AND attempts < 32767");
            if let Some(chunk) = chunk {
                q.push(" AND id IN ");
                push_ids(&mut q, chunk.iter().map(|id| id.0));
            }
            q.push(tail);
            let some: Vec<Dead> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
            dead.extend(some);
        }
        dead.sort_unstable_by_key(|d| d.id);
        Ok(dead)
    }

    /// SPEC M2: revives the dead jobs of `queue` (all, or those among `ids`): back to
    /// `ready`, or `blocked` behind their group, which then gets its holder.
    async fn retry_dead_tx(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let (mut tx, now) = self.write(&[queue]).await?;
        let dead = Self::revivable(&mut tx, queue, ids).await?;
        // Two dead jobs may share a dedupe key: only the first of them comes back. The
        // unique index pads with spaces, so keys are compared as it does.
        let mut keys = std::collections::HashSet::new();
        let mut touched = Touched::default();
        let mut revive = Vec::new();
        for d in &dead {
            if let Some(key) = &d.dedupe_key
                && !keys.insert(key.trim_end_matches(' ').to_owned())
            {
                continue;
            }
            if let Some(group) = &d.group_key {
                touched.group(queue, group);
            }
            revive.push(d.id);
        }
        for chunk in revive.chunks(ID_CHUNK) {
            // Attempts go on counting and max_attempts grows by the enqueued budget
            // (SPEC M2). `budget` is set first and read through COALESCE, so the
            // result is the same whether assignments see earlier ones (MySQL) or not
            // (MariaDB's SIMULTANEOUS_ASSIGNMENT).
            let mut q = QueryBuilder::<MySql>::new(
                "UPDATE relayq_jobs
                 SET state = IF(group_key IS NULL, 'ready', 'blocked'), finished_at = NULL,
                     budget = COALESCE(budget, max_attempts),
                     max_attempts = LEAST(32767, attempts + COALESCE(budget, max_attempts)),
                     run_at = ",
            );
            q.push_bind(now).push(" WHERE id IN ");
            push_ids(&mut q, chunk.iter().copied());
            q.build().execute(&mut *tx).await.map_err(db)?;
        }
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        Ok(revive.len() as u64)
    }

    /// SPEC C5: the queue's expired leases processed, in one transaction; returns
    /// (requeued, dead) and the server's time.
    async fn expire_tx(&self, queue: &str) -> Result<(u64, u64, i64)> {
        let (mut tx, now) = self.write(&[queue]).await?;
        let (requeued, dead) = claim::expire(&mut tx, queue, now).await?;
        tx.commit().await.map_err(db)?;
        Ok((requeued, dead, now))
    }

    /// SPEC M3: deletes up to [`PRUNE_CHUNK`] jobs of `queue` finished at or before
    /// `cutoff`, with their log, in one transaction; returns how many.
    async fn prune_tx(&self, queue: &str, cutoff: i64) -> Result<u64> {
        let (mut tx, _) = self.write(&[queue]).await?;
        let ids: Vec<i64> = sqlx::query_scalar(PRUNABLE)
            .bind(queue)
            .bind(cutoff)
            .bind(i64::from(PRUNE_CHUNK))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let pruned = delete(&mut tx, &ids).await?;
        tx.commit().await.map_err(db)?;
        Ok(pruned)
    }

    /// SPEC M3: deletes the queue's sealed batches left without jobs, under the
    /// queue's lock, so that no enqueue into one is under way.
    async fn prune_batches_tx(&self, queue: &str) -> Result<()> {
        let (mut tx, _) = self.write(&[queue]).await?;
        let gone: Vec<i64> = sqlx::query_scalar(PRUNE_BATCHES)
            .bind(queue)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        for chunk in gone.chunks(ID_CHUNK) {
            let mut q = QueryBuilder::<MySql>::new("DELETE FROM relayq_batches WHERE id IN ");
            push_ids(&mut q, chunk.iter().copied());
            q.build().execute(&mut *tx).await.map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(())
    }
}

#[async_trait]
impl Admin for MysqlBackend {
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        retry_transient(|| self.set_queue(queue, &update), crate::deadlocked).await
    }

    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        retry_transient(
            || self.set_key_limit_once(queue, key, limit),
            crate::deadlocked,
        )
        .await
    }

    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<relayq_core::Rate>,
    ) -> Result<()> {
        retry_transient(
            || self.set_key_rate_once(queue, key, rate),
            crate::deadlocked,
        )
        .await
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        retry_transient(
            || self.cancel_job_tx(queue, id, cancelled_by::JOB),
            crate::deadlocked,
        )
        .await
    }

    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        self.cancel_batch_as(batch, cancelled_by::BATCH).await
    }

    /// Each batch in a transaction of its own, then the jobs of no batch by the
    /// hundred, so the queue's lock is never held for long; only jobs up to the newest
    /// id at the start, so a steady stream of enqueues cannot keep it going.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let newest: Option<i64> = sqlx::query_scalar(NEWEST)
            .bind(queue)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(db)?;
        let Some(newest) = newest else { return Ok(0) };
        let batches: Vec<i64> = sqlx::query_scalar(PURGE_BATCHES)
            .bind(queue)
            .bind(newest)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        let batch = |b: Batch| async move { self.cancel_batch_as(&b, cancelled_by::PURGE).await };
        let step = || retry_transient(|| self.purge_step_tx(queue, newest), crate::deadlocked);
        kit::purge::purge(queue, batches, batch, step).await
    }

    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        retry_transient(|| self.delete_jobs_tx(queue, ids), crate::deadlocked).await
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        retry_transient(|| self.run_now_tx(queue, ids), crate::deadlocked).await
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        if ids.is_some_and(<[JobId]>::is_empty) {
            return Ok(0);
        }
        retry_transient(|| self.retry_dead_tx(queue, ids), crate::deadlocked).await
    }

    /// Expiry in one transaction, then pruning by [`PRUNE_CHUNK`] jobs a
    /// transaction, then the batches left empty: the queue's lock is never held long.
    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        let (requeued, dead, now) =
            retry_transient(|| self.expire_tx(queue), crate::deadlocked).await?;
        let cutoff = now.saturating_sub(micros(retention));
        let mut pruned = 0;
        loop {
            let n = retry_transient(|| self.prune_tx(queue, cutoff), crate::deadlocked).await?;
            pruned += n;
            if n < u64::from(PRUNE_CHUNK) {
                break;
            }
        }
        retry_transient(|| self.prune_batches_tx(queue), crate::deadlocked).await?;
        Ok(Maintenance {
            requeued,
            dead,
            pruned,
        })
    }

    /// A pass is several transactions: it runs under the queue's maintenance lock
    /// ([`TRY_MAINTAIN_LOCK`]), and is skipped at once while another session holds it
    /// (SPEC M3). A pass dropped halfway closes the lock's connection, which frees it.
    async fn try_maintain_unchecked(
        &self,
        queue: &str,
        retention: Duration,
    ) -> Result<Option<Maintenance>> {
        let database = self.inner.name.as_str();
        let mut c = self.inner.pool.acquire().await.map_err(db)?;
        let got: Option<i64> = sqlx::query_scalar(TRY_MAINTAIN_LOCK)
            .bind(database)
            .bind(queue)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
        if got != Some(1) {
            return Ok(None);
        }
        let lock = NamedLock(Some(c));
        let pass = self.maintain_unchecked(queue, retention).await;
        lock.release(database, queue).await;
        pass.map(Some)
    }
}
