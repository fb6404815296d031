//! SPEC S: schedules. A slot fires in one transaction that locks the schedule's row,
//! moves its mark and stores the slot's jobs; a scheduler that finds the row locked
//! answers `Busy` at once rather than wait behind another.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    BatchId, Error, JobId, Result, Schedules,
    kit::fire::refusal,
    retry::retry_transient,
    schedule::{Fire, Fired, StoredSchedule},
};

use crate::{PostgresBackend, db, listen};

type Row = (
    String,
    String,
    i64,
    DateTime<Utc>,
    bool,
    Option<DateTime<Utc>>,
    Option<i64>,
    Option<i64>,
);

fn stored(r: Row) -> StoredSchedule {
    StoredSchedule {
        name: r.0,
        definition: r.1,
        version: r.2,
        mark: r.3,
        paused: r.4,
        last_slot: r.5,
        last_job: r.6.map(JobId),
        last_batch: r.7.map(BatchId),
    }
}

impl PostgresBackend {
    async fn fire_tx(&self, fire: &Fire) -> Result<(Fired, Vec<String>)> {
        let mut tx = self.pool().begin().await.map_err(db)?;
        // A slot locks the row, skipping it when another scheduler holds it; "run now"
        // changes nothing of the row and only reads it.
        let read = if fire.slot.is_some() {
            "SELECT version, mark, paused, now() FROM {s}.schedules
             WHERE queue = $1 AND name = $2 FOR UPDATE SKIP LOCKED"
        } else {
            "SELECT version, mark, paused, now() FROM {s}.schedules
             WHERE queue = $1 AND name = $2"
        };
        let row: Option<(i64, DateTime<Utc>, bool, DateTime<Utc>)> = sqlx::query_as(self.sql(read))
            .bind(&fire.queue)
            .bind(&fire.name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let Some((version, mark, paused, now)) = row else {
            let exists: bool =
                sqlx::query_scalar(self.sql(
                    "SELECT EXISTS (SELECT 1 FROM {s}.schedules WHERE queue = $1 AND name = $2)",
                ))
                .bind(&fire.queue)
                .bind(&fire.name)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
            tx.rollback().await.map_err(db)?;
            return Ok((if exists { Fired::Busy } else { Fired::Gone }, Vec::new()));
        };
        if let Some(no) = refusal(fire, version, mark, paused, now) {
            // Ended here, not when the transaction is dropped: a dropped one rolls back
            // only once its connection is next used, and holds the row's lock until
            // then, so the next fire would find the row busy.
            tx.rollback().await.map_err(db)?;
            return Ok((no, Vec::new()));
        }
        let asked = !fire.jobs.is_empty();
        let batch = match fire.batch.filter(|_| asked) {
            Some(on_failure) => Some(BatchId(
                sqlx::query_scalar(self.sql(
                    "INSERT INTO {s}.batches (queue, on_failure, name) VALUES ($1, $2, $3)
                     RETURNING id",
                ))
                .bind(&fire.queue)
                .bind(on_failure.as_str())
                .bind(&fire.name)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?,
            )),
            None => None,
        };
        let (jobs, mut payloads) = if asked {
            let mut jobs = fire.jobs.clone();
            for job in &mut jobs {
                job.batch = batch;
            }
            self.enqueue_on(&mut tx, &jobs).await?
        } else {
            (Vec::new(), Vec::new())
        };
        if let Some(b) = batch {
            sqlx::query(self.sql("UPDATE {s}.batches SET sealed = true WHERE id = $1"))
                .bind(b.0)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            // Waiters for the whole batch re-check, as after `seal`.
            let sealed = vec![format!("{}:{}", listen::FINISHED, fire.queue)];
            listen::send(&mut tx, &self.inner.schema.channel(), &sealed).await?;
            payloads.extend(sealed);
        }
        let made = Fired::Made { batch, jobs };
        if let Some(slot) = fire.slot {
            let (batch, job) = made.made().unwrap_or_default();
            sqlx::query(self.sql(
                "UPDATE {s}.schedules SET mark = $3,
                     last_slot = CASE WHEN $4 THEN $3 ELSE last_slot END,
                     last_job = CASE WHEN $4 THEN $5 ELSE last_job END,
                     last_batch = CASE WHEN $4 THEN $6 ELSE last_batch END
                 WHERE queue = $1 AND name = $2",
            ))
            .bind(&fire.queue)
            .bind(&fire.name)
            .bind(slot)
            .bind(asked)
            .bind(job.map(|j| j.0))
            .bind(batch.map(|b| b.0))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok((made, payloads))
    }
}

#[async_trait]
impl Schedules for PostgresBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        // A replacement keeps the mark and the pause flag (SPEC S1).
        sqlx::query(self.sql(
            "INSERT INTO {s}.schedules (queue, name, definition, version, mark)
             VALUES ($1, $2, $3, 1, COALESCE($4, now()))
             ON CONFLICT (queue, name) DO UPDATE
             SET definition = EXCLUDED.definition, version = {s}.schedules.version + 1",
        ))
        .bind(queue)
        .bind(name)
        .bind(definition)
        .bind(starting)
        .execute(self.pool())
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        let mut c = self.pool().acquire().await.map_err(db)?;
        let rows: Vec<Row> = sqlx::query_as(self.sql(
            "SELECT name, definition, version, mark, paused, last_slot, last_job, last_batch
             FROM {s}.schedules WHERE queue = $1 ORDER BY name",
        ))
        .bind(queue)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
        // The server's clock, which judges every slot: not this process's.
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
        Ok((rows.into_iter().map(stored).collect(), now))
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        let n = sqlx::query(self.sql("DELETE FROM {s}.schedules WHERE queue = $1 AND name = $2"))
            .bind(queue)
            .bind(name)
            .execute(self.pool())
            .await
            .map_err(db)?
            .rows_affected();
        Ok(n > 0)
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        let n = sqlx::query(
            self.sql("UPDATE {s}.schedules SET paused = $3 WHERE queue = $1 AND name = $2"),
        )
        .bind(queue)
        .bind(name)
        .bind(paused)
        .execute(self.pool())
        .await
        .map_err(db)?
        .rows_affected();
        if n == 0 {
            return Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            )));
        }
        Ok(())
    }

    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired> {
        let (fired, payloads) = retry_transient(|| self.fire_tx(&fire), crate::retryable).await?;
        self.notify_local(&payloads);
        Ok(fired)
    }
}
