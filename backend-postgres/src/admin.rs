//! SPEC C6, B7, M2, M3: operating queues.

use std::time::Duration;

use async_trait::async_trait;
use relayq_core::{
    Admin, Batch, Error, JobId, JobState, Maintenance, QueueUpdate, Rate, Result, cancelled_by,
    kit, retry::retry_transient,
};
use sqlx::PgConnection;

use crate::{
    PostgresBackend, db, listen, micros,
    promote::{self, Touched, archive},
};

/// Cancels the unfinished jobs `$1` (ids, locked by the caller): they move to
/// `finished` as `cancelled`, and a running one's attempt is closed in the log, which
/// revokes its lease (SPEC B7). Returns each cancelled job's place.
const CANCEL: &str = concat!(
    "WITH g AS (
        DELETE FROM {s}.jobs WHERE id = ANY($1)
        RETURNING *),
    logged AS (
        INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error,
                                  claimed_at)
        SELECT id, attempts, worker, started_at, now(), 'cancelled', $2, started_at
        FROM g WHERE state = 'running'),
    archived AS (",
    archive!("g", "'cancelled'", "g.last_error"),
    ")
    SELECT queue, group_key, batch_id, stage, id FROM g"
);

/// Finished jobs pruned per statement, so a large backlog never makes one huge
/// transaction.
const PRUNE_CHUNK: i64 = 10_000;

type Place = (String, Option<String>, Option<i64>, Option<i32>, i64);

/// Creates the queue's row, or locks it: a change of no key column, so its lock does
/// not wait for the `FOR KEY SHARE` of settles freeing slots (only for a keyed claim
/// in progress).
const LOCK_QUEUE_ROW: &str = "INSERT INTO {s}.queues (queue) VALUES ($1)
    ON CONFLICT (queue) DO UPDATE SET keyed = {s}.queues.keyed";

/// After a change of key limits or rates: the queue's `keyed` (its claims judge keys)
/// and `key_rated` (keys have rates) flags, the parked jobs of key `$4` (every key's
/// when NULL) back in the claim index, where the next claim parks again those still
/// held, and the queue's workers woken (`$2`, `$3`).
const KEY_FLAGS: &str = "WITH flag AS (
        UPDATE {s}.queues SET keyed = key_limit IS NOT NULL
            OR key_rate_count IS NOT NULL
            OR EXISTS (SELECT 1 FROM {s}.key_limits WHERE queue = $1)
            OR EXISTS (SELECT 1 FROM {s}.key_rates WHERE queue = $1),
            key_rated = key_rate_count IS NOT NULL
            OR EXISTS (SELECT 1 FROM {s}.key_rates WHERE queue = $1)
        WHERE queue = $1),
    unparked AS (
        UPDATE {s}.jobs SET parked = false
        WHERE queue = $1 AND parked AND state IN ('ready', 'retrying')
          AND ($4::text IS NULL OR limit_key = $4))
    SELECT pg_notify($2, $3)";

impl PostgresBackend {
    async fn set_queue(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        let max = update.max_running;
        let max_value = max.flatten().map(|m| i32::try_from(m).unwrap_or(i32::MAX));
        let rate = update.rate.flatten();
        let payload = format!("{}:{queue}", listen::READY);
        // A new rate starts afresh (SPEC K8): its next start is cleared with it; the
        // same rate set again keeps it. (Every expression reads the row as it was.)
        sqlx::query(self.sql(
            "WITH up AS (
                 INSERT INTO {s}.queues (queue, paused, max_running, rate_count, rate_per_us,
                                         rate_burst)
                 VALUES ($1, COALESCE($2, false), $4, $8, $9, $10)
                 ON CONFLICT (queue) DO UPDATE SET
                     paused = COALESCE($2, {s}.queues.paused),
                     max_running = CASE WHEN $3 THEN $4 ELSE {s}.queues.max_running END,
                     rate_count = CASE WHEN $7 THEN $8 ELSE {s}.queues.rate_count END,
                     rate_per_us = CASE WHEN $7 THEN $9 ELSE {s}.queues.rate_per_us END,
                     rate_burst = CASE WHEN $7 THEN $10 ELSE {s}.queues.rate_burst END,
                     rate_tat = CASE WHEN $7 AND ({s}.queues.rate_count, {s}.queues.rate_per_us,
                                                  {s}.queues.rate_burst)
                                                 IS DISTINCT FROM ($8, $9, $10)
                                     THEN NULL ELSE {s}.queues.rate_tat END
                 RETURNING 1)
             SELECT pg_notify($5, $6) FROM up",
        ))
        .bind(queue)
        .bind(update.paused)
        .bind(max.is_some())
        .bind(max_value)
        .bind(self.inner.schema.channel())
        .bind(&payload)
        .bind(update.rate.is_some())
        .bind(rate.map(|r| i32::try_from(r.count).unwrap_or(i32::MAX)))
        .bind(rate.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX)))
        .bind(rate.map(|r| i32::try_from(r.burst).unwrap_or(i32::MAX)))
        .execute(self.pool())
        .await
        .map_err(db)?;
        self.notify_local(&[payload]);
        Ok(())
    }

    /// SPEC K1, K3: stores the limit, keeps the queue's `keyed` flag (whether its claims
    /// count keys) and puts every parked job of the queue back in the claim index: the
    /// next claim parks again those whose key is still full. Under the queue row's
    /// lock, as a keyed claim and a freed slot's unpark are.
    pub(crate) async fn set_key_limit_tx(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        let limit = limit.map(|m| i32::try_from(m).unwrap_or(i32::MAX));
        let payload = format!("{}:{queue}", listen::READY);
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        sqlx::query(self.sql(LOCK_QUEUE_ROW))
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let change = match key {
            None => "UPDATE {s}.queues SET key_limit = $3 WHERE queue = $1 AND $2::text IS NULL",
            Some(_) if limit.is_some() => {
                "INSERT INTO {s}.key_limits (queue, limit_key, max) VALUES ($1, $2, $3)
                 ON CONFLICT (queue, limit_key) DO UPDATE SET max = EXCLUDED.max"
            }
            Some(_) => {
                "DELETE FROM {s}.key_limits
                 WHERE queue = $1 AND limit_key = $2 AND $3::int IS NULL"
            }
        };
        sqlx::query(self.sql(change))
            .bind(queue)
            .bind(key)
            .bind(limit)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(self.sql(KEY_FLAGS))
            .bind(queue)
            .bind(self.inner.schema.channel())
            .bind(&payload)
            .bind(None::<&str>)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.notify_local(&[payload]);
        Ok(())
    }

    /// SPEC K12: stores a key's rate or the default key rate under the queue row's
    /// lock, as [`set_key_limit_tx`](Self::set_key_limit_tx) stores limits: a new rate
    /// starts afresh, the same rate again changes nothing, and the parked jobs it may
    /// concern go back to the claim index.
    pub(crate) async fn set_key_rate_tx(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<Rate>,
    ) -> Result<()> {
        let count = rate.map(|r| i32::try_from(r.count).unwrap_or(i32::MAX));
        let per = rate.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX));
        let burst = rate.map(|r| i32::try_from(r.burst).unwrap_or(i32::MAX));
        let payload = format!("{}:{queue}", listen::READY);
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        sqlx::query(self.sql(LOCK_QUEUE_ROW))
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let was: Option<(Option<i32>, Option<i64>, Option<i32>)> = sqlx::query_as(self.sql(
            "SELECT key_rate_count, key_rate_per_us, key_rate_burst FROM {s}.queues
             WHERE queue = $1 AND $2::text IS NULL
             UNION ALL
             SELECT rate_count, rate_per_us, rate_burst FROM {s}.key_rates
             WHERE queue = $1 AND limit_key = $2",
        ))
        .bind(queue)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if was.unwrap_or_default() == (count, per, burst) {
            return tx.commit().await.map_err(db);
        }
        let change = match key {
            // A new default starts afresh for every key under it: their rows go.
            None => {
                "WITH d AS (
                     UPDATE {s}.queues SET key_rate_count = $3, key_rate_per_us = $4,
                         key_rate_burst = $5
                     WHERE queue = $1 AND $2::text IS NULL)
                 DELETE FROM {s}.key_rates WHERE queue = $1 AND rate_count IS NULL"
            }
            Some(_) if rate.is_some() => {
                "INSERT INTO {s}.key_rates (queue, limit_key, rate_count, rate_per_us, rate_burst)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (queue, limit_key) DO UPDATE
                 SET rate_count = EXCLUDED.rate_count, rate_per_us = EXCLUDED.rate_per_us,
                     rate_burst = EXCLUDED.rate_burst, tat = NULL, wake_at = NULL"
            }
            // Lifted, the key starts afresh under the default, if there is one.
            Some(_) => {
                "DELETE FROM {s}.key_rates
                 WHERE queue = $1 AND limit_key = $2
                   AND $3::int IS NULL AND $4::bigint IS NULL AND $5::int IS NULL"
            }
        };
        sqlx::query(self.sql(change))
            .bind(queue)
            .bind(key)
            .bind(count)
            .bind(per)
            .bind(burst)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(self.sql(KEY_FLAGS))
            .bind(queue)
            .bind(self.inner.schema.channel())
            .bind(&payload)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.notify_local(&[payload]);
        Ok(())
    }

    /// Cancels `ids` inside the transaction and promotes what they released.
    /// Cancels `ids`; `why` goes to the log of each attempt it cuts short.
    async fn cancel_ids(
        c: &mut PgConnection,
        this: &Self,
        ids: &[i64],
        why: &str,
    ) -> Result<(u64, Touched)> {
        let places: Vec<Place> = sqlx::query_as(this.sql(CANCEL))
            .bind(ids)
            .bind(why)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let mut touched = Touched::default();
        for (queue, group, batch, stage, id) in &places {
            touched.left(queue, group.as_deref(), *batch, *stage, JobState::Cancelled);
            touched.parent(*id, *batch, JobState::Cancelled);
            touched.finished.insert(queue.clone());
        }
        promote::promote(c, &this.inner.schema, &mut touched).await?;
        Ok((places.len() as u64, touched))
    }

    async fn finish_tx(
        mut tx: sqlx::PgTransaction<'_>,
        this: &Self,
        t: &Touched,
    ) -> Result<Vec<String>> {
        let payloads = t.payloads();
        listen::send(&mut tx, &this.inner.schema.channel(), &t.unsent()).await?;
        tx.commit().await.map_err(db)?;
        Ok(payloads)
    }

    /// SPEC M10. A `ready` job here is never blocked, and a ready grouped job is its
    /// group's next: moving its `run_at` earlier keeps it first in its group.
    async fn run_now_tx(&self, queue: &str, ids: &[i64]) -> Result<(u64, Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let n: i64 = sqlx::query_scalar(self.sql(
            "WITH m AS (UPDATE {s}.jobs SET run_at = now()
                        WHERE id = ANY ($2) AND queue = $1 AND state IN ('ready', 'retrying')
                          AND run_at > now()
                        RETURNING id)
             SELECT count(*) FROM m",
        ))
        .bind(queue)
        .bind(ids)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let mut touched = Touched::default();
        if n > 0 {
            touched.ready.insert(queue.to_owned());
        }
        Ok((
            u64::try_from(n).unwrap_or(0),
            Self::finish_tx(tx, self, &touched).await?,
        ))
    }

    async fn cancel_job_tx(&self, queue: &str, id: JobId) -> Result<(bool, Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let live: Option<i64> = sqlx::query_scalar(
            self.sql("SELECT id FROM {s}.jobs WHERE id = $1 AND queue = $2 FOR UPDATE"),
        )
        .bind(id.0)
        .bind(queue)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if live.is_none() {
            let finished: Option<i64> = sqlx::query_scalar(
                self.sql("SELECT id FROM {s}.finished WHERE id = $1 AND queue = $2"),
            )
            .bind(id.0)
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
            return match finished {
                Some(_) => Ok((false, Vec::new())),
                None => Err(Error::not_found(format!("job {id} in queue {queue:?}"))),
            };
        }
        let (_, mut touched) = Self::cancel_ids(&mut tx, self, &[id.0], cancelled_by::JOB).await?;
        touched.revoked.insert(queue.to_owned());
        Ok((true, Self::finish_tx(tx, self, &touched).await?))
    }

    async fn cancel_batch_tx(&self, batch: &Batch, why: &str) -> Result<(u64, Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        // Lock order: job rows first, then the batch (as settles do).
        let lock_jobs = "SELECT id FROM {s}.jobs WHERE batch_id = $1 ORDER BY id FOR UPDATE";
        sqlx::query(self.sql(lock_jobs))
            .bind(batch.id.0)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let found: Option<i64> =
            sqlx::query_scalar(self.sql(
                "UPDATE {s}.batches SET sealed = true WHERE id = $1 AND queue = $2 RETURNING id",
            ))
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        if found.is_none() {
            return Err(Error::not_found(batch.to_string()));
        }
        // Sealed now: no job can join any more. Jobs that joined before the seal but
        // after the first look are in this second one.
        let ids: Vec<i64> = sqlx::query_scalar(self.sql(lock_jobs))
            .bind(batch.id.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let (n, mut touched) = Self::cancel_ids(&mut tx, self, &ids, why).await?;
        touched.finished.insert(batch.queue.clone());
        if n > 0 {
            touched.revoked.insert(batch.queue.clone());
        }
        Ok((n, Self::finish_tx(tx, self, &touched).await?))
    }

    /// SPEC B9: up to 100 unfinished jobs of no batch up to `newest`, last in claim
    /// order first, locked in id order as every writer locks job rows, cancelled in
    /// one statement. `None` once none is left; a step whose jobs all finished before
    /// their lock cancels none and is followed by another.
    async fn purge_tx(&self, queue: &str, newest: i64) -> Result<Option<(u64, Vec<String>)>> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let found: Vec<i64> = sqlx::query_scalar(self.sql(
            "SELECT id FROM {s}.jobs WHERE queue = $1 AND batch_id IS NULL AND id <= $2
             ORDER BY priority DESC, run_at DESC, id DESC LIMIT 100",
        ))
        .bind(queue)
        .bind(newest)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        if found.is_empty() {
            return Ok(None);
        }
        let ids: Vec<i64> = sqlx::query_scalar(
            self.sql("SELECT id FROM {s}.jobs WHERE id = ANY ($1) ORDER BY id FOR UPDATE"),
        )
        .bind(&found)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let (n, mut touched) = Self::cancel_ids(&mut tx, self, &ids, cancelled_by::PURGE).await?;
        touched.revoked.insert(queue.to_owned());
        Ok(Some((n, Self::finish_tx(tx, self, &touched).await?)))
    }

    async fn retry_dead_tx(&self, queue: &str, ids: Option<&[i64]>) -> Result<(u64, Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        // Attempts go on counting and max_attempts grows by the enqueued budget
        // (SPEC M2). Jobs of a batch stay dead: reviving one after later stages started
        // would break the order barrier. So does a job whose dedupe key another job now holds (the
        // insert skips it, and the first of two dead jobs sharing a key wins).
        let revived: Vec<(i64, Option<String>)> = sqlx::query_as(self.sql(
            "WITH d AS MATERIALIZED (
                 SELECT * FROM {s}.finished
                 WHERE queue = $1 AND state = 'dead' AND batch_id IS NULL
                   AND ($2::bigint[] IS NULL OR id = ANY($2)) AND attempts < 32767
                 ORDER BY id FOR UPDATE),
             ins AS (
                 INSERT INTO {s}.jobs (id, queue, state, payload, priority, run_at, max_attempts,
                                       attempts, budget, group_key, dedupe_key, enqueued_by,
                                       created_at, last_error, progress, limit_key)
                 SELECT id, queue, CASE WHEN group_key IS NULL THEN 'ready' ELSE 'blocked' END,
                        payload, priority, now(),
                        least(32767, attempts::int + coalesce(budget, max_attempts)), attempts,
                        coalesce(budget, max_attempts), group_key, dedupe_key,
                        enqueued_by, created_at, last_error, progress, limit_key
                 FROM d ORDER BY id
                 ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
                 RETURNING id, group_key),
             gone AS (DELETE FROM {s}.finished f USING ins WHERE f.id = ins.id)
             SELECT id, group_key FROM ins",
        ))
        .bind(queue)
        .bind(ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let mut touched = Touched::default();
        touched.ready.insert(queue.to_owned());
        for (_, group) in &revived {
            if let Some(group) = group {
                touched.group(queue, group);
            }
        }
        promote::promote(&mut tx, &self.inner.schema, &mut touched).await?;
        Ok((
            revived.len() as u64,
            Self::finish_tx(tx, self, &touched).await?,
        ))
    }

    /// SPEC M3: deletes finished jobs of `queue` older than `retention`, with their
    /// log, in chunks; then sealed batches left without jobs.
    async fn prune(&self, queue: &str, retention: Duration) -> Result<u64> {
        // Beyond a century, keep everything.
        let retention = micros(retention.min(Duration::from_secs(100 * 365 * 86_400)));
        let mut pruned = 0;
        loop {
            let n: i64 = sqlx::query_scalar(self.sql(
                "WITH p AS (
                     DELETE FROM {s}.finished WHERE id = ANY (ARRAY(
                         SELECT id FROM {s}.finished
                         WHERE queue = $1 AND state IN ('succeeded', 'dead', 'cancelled')
                           AND finished_at <= now() - $2::float8 * interval '1 microsecond'
                         LIMIT $3))
                     RETURNING id),
                 a AS (DELETE FROM {s}.attempts WHERE job_id = ANY (ARRAY(SELECT id FROM p))),
                 e AS (DELETE FROM {s}.job_deps WHERE child_id = ANY (ARRAY(SELECT id FROM p)))
                 SELECT count(*) FROM p",
            ))
            .bind(queue)
            .bind(retention)
            .bind(PRUNE_CHUNK)
            .fetch_one(self.pool())
            .await
            .map_err(db)?;
            pruned += u64::try_from(n).unwrap_or(0);
            if n < PRUNE_CHUNK {
                break;
            }
        }
        sqlx::query(self.sql(
            "DELETE FROM {s}.batches b WHERE queue = $1 AND sealed
               AND NOT EXISTS (SELECT 1 FROM {s}.jobs WHERE batch_id = b.id)
               AND NOT EXISTS (SELECT 1 FROM {s}.finished WHERE batch_id = b.id)",
        ))
        .bind(queue)
        .execute(self.pool())
        .await
        .map_err(db)?;
        Ok(pruned)
    }
}

#[async_trait]
impl Admin for PostgresBackend {
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        self.set_queue(queue, update).await
    }

    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        retry_transient(
            || self.set_key_limit_tx(queue, key, limit),
            crate::retryable,
        )
        .await
    }

    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<Rate>,
    ) -> Result<()> {
        retry_transient(|| self.set_key_rate_tx(queue, key, rate), crate::retryable).await
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        let (changed, payloads) =
            retry_transient(|| self.cancel_job_tx(queue, id), crate::retryable).await?;
        self.notify_local(&payloads);
        Ok(changed)
    }

    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        let (n, payloads) = retry_transient(
            || self.cancel_batch_tx(batch, cancelled_by::BATCH),
            crate::retryable,
        )
        .await?;
        self.notify_local(&payloads);
        Ok(n)
    }

    /// Each batch in a transaction of its own, then the jobs of no batch by the
    /// hundred, so no transaction holds many locks for long; only jobs up to the newest
    /// id at the start, so a steady stream of enqueues cannot keep it going.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let newest: Option<i64> =
            sqlx::query_scalar(self.sql("SELECT max(id) FROM {s}.jobs WHERE queue = $1"))
                .bind(queue)
                .fetch_one(self.pool())
                .await
                .map_err(db)?;
        let Some(newest) = newest else { return Ok(0) };
        let batches: Vec<i64> = sqlx::query_scalar(self.sql(
            "SELECT DISTINCT batch_id FROM {s}.jobs
             WHERE queue = $1 AND batch_id IS NOT NULL AND id <= $2",
        ))
        .bind(queue)
        .bind(newest)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let batch = |b: Batch| async move {
            let (n, payloads) = retry_transient(
                || self.cancel_batch_tx(&b, cancelled_by::PURGE),
                crate::retryable,
            )
            .await?;
            self.notify_local(&payloads);
            Ok(n)
        };
        let step = || async move {
            let done = retry_transient(|| self.purge_tx(queue, newest), crate::retryable).await?;
            Ok(done.map(|(n, payloads)| {
                self.notify_local(&payloads);
                n
            }))
        };
        kit::purge::purge(queue, batches, batch, step).await
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let (n, payloads) =
            retry_transient(|| self.run_now_tx(queue, &ids), crate::retryable).await?;
        self.notify_local(&payloads);
        Ok(n)
    }

    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        // Finished jobs live in `finished` only: an unfinished one is never matched.
        let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let n: i64 = sqlx::query_scalar(self.sql(
            "WITH d AS (DELETE FROM {s}.finished WHERE queue = $1 AND id = ANY ($2) RETURNING id),
                  a AS (DELETE FROM {s}.attempts WHERE job_id = ANY (ARRAY(SELECT id FROM d))),
                  e AS (DELETE FROM {s}.job_deps WHERE child_id = ANY (ARRAY(SELECT id FROM d)))
             SELECT count(*) FROM d",
        ))
        .bind(queue)
        .bind(&ids)
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let ids: Option<Vec<i64>> = ids.map(|ids| ids.iter().map(|id| id.0).collect());
        let (n, payloads) = retry_transient(
            || self.retry_dead_tx(queue, ids.as_deref()),
            crate::retryable,
        )
        .await?;
        self.notify_local(&payloads);
        Ok(n)
    }

    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        let (requeued, dead) = self.expire(queue, true).await?;
        let pruned = self.prune(queue, retention).await?;
        // A key's value under the default key rate that lies in the past, with no wake
        // time, is the same as none (`kit::rate` starts from now either way): the row
        // goes, so keys that never start again leave nothing behind (SPEC K12).
        sqlx::query(self.sql(
            "DELETE FROM {s}.key_rates
             WHERE queue = $1 AND rate_count IS NULL AND wake_at IS NULL
               AND (tat IS NULL OR tat <= (extract(epoch FROM now()) * 1e6)::bigint)",
        ))
        .bind(queue)
        .execute(self.pool())
        .await
        .map_err(db)?;
        Ok(Maintenance {
            requeued,
            dead,
            pruned,
        })
    }

    /// Holds a transaction-level advisory lock on a connection of its own while the
    /// pass runs on others: a pass that is dropped or whose process dies releases it
    /// with that transaction. The transaction takes no snapshot between statements and
    /// writes nothing, so it holds back no vacuum.
    async fn try_maintain_unchecked(
        &self,
        queue: &str,
        retention: Duration,
    ) -> Result<Option<Maintenance>> {
        let mut lock = self.pool().begin().await.map_err(db)?;
        let got: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(self.maintenance_lock_key(queue))
                .fetch_one(&mut *lock)
                .await
                .map_err(db)?;
        if !got {
            return Ok(None);
        }
        let pass = self.maintain(queue, retention).await;
        lock.rollback().await.ok();
        pass.map(Some)
    }
}

impl PostgresBackend {
    /// The name of the advisory lock a maintenance pass over `queue` holds:
    /// `pg_advisory_xact_lock(hashtextextended(<this>, 0))`.
    #[must_use]
    pub fn maintenance_lock_key(&self, queue: &str) -> String {
        format!("relayq maintain {} {queue}", self.schema())
    }
}
