//! SPEC S: schedules. A slot fires in one write transaction that moves the mark and
//! stores the slot's jobs, so a crash between the two cannot happen.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    BatchId, Error, EventKind, JobId, Result, Schedules,
    kit::fire::refusal,
    schedule::{Fire, Fired, StoredSchedule},
};

use crate::{SqliteBackend, at, db, enqueue::enqueue_in, us};

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    definition: String,
    version: i64,
    mark: i64,
    paused: bool,
    last_slot: Option<i64>,
    last_job: Option<i64>,
    last_batch: Option<i64>,
}

impl From<Row> for StoredSchedule {
    fn from(r: Row) -> Self {
        Self {
            name: r.name,
            definition: r.definition,
            version: r.version,
            mark: at(r.mark),
            paused: r.paused,
            last_slot: r.last_slot.map(at),
            last_job: r.last_job.map(JobId),
            last_batch: r.last_batch.map(BatchId),
        }
    }
}

#[async_trait]
impl Schedules for SqliteBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let (mut tx, now) = self.write().await?;
        // A replacement keeps the mark and the pause flag (SPEC S1).
        sqlx::query(
            "INSERT INTO relayq_schedules (queue, name, definition, version, mark)
             VALUES (?1, ?2, ?3, 1, ?4)
             ON CONFLICT (queue, name) DO UPDATE
             SET definition = excluded.definition, version = version + 1",
        )
        .bind(queue)
        .bind(name)
        .bind(definition)
        .bind(us(starting.unwrap_or(now)))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, definition, version, mark, paused, last_slot, last_job, last_batch
             FROM relayq_schedules WHERE queue = ?1 ORDER BY name",
        )
        .bind(queue)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        // SQLite's clock is this machine's: the same one `write` stamps with.
        Ok((rows.into_iter().map(Into::into).collect(), Utc::now()))
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        let (mut tx, _) = self.write().await?;
        let n = sqlx::query("DELETE FROM relayq_schedules WHERE queue = ?1 AND name = ?2")
            .bind(queue)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        tx.commit().await.map_err(db)?;
        Ok(n > 0)
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        let (mut tx, _) = self.write().await?;
        let n =
            sqlx::query("UPDATE relayq_schedules SET paused = ?3 WHERE queue = ?1 AND name = ?2")
                .bind(queue)
                .bind(name)
                .bind(paused)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
        tx.commit().await.map_err(db)?;
        if n == 0 {
            return Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            )));
        }
        Ok(())
    }

    async fn fire_unchecked(&self, mut fire: Fire) -> Result<Fired> {
        let (mut tx, now) = self.write().await?;
        let row: Option<(i64, i64, bool)> = sqlx::query_as(
            "SELECT version, mark, paused FROM relayq_schedules WHERE queue = ?1 AND name = ?2",
        )
        .bind(&fire.queue)
        .bind(&fire.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let Some((version, mark, paused)) = row else {
            return Ok(Fired::Gone);
        };
        if let Some(no) = refusal(&fire, version, at(mark), paused, now) {
            return Ok(no);
        }
        let asked = !fire.jobs.is_empty();
        let batch = match fire.batch.filter(|_| asked) {
            Some(on_failure) => Some(BatchId(
                sqlx::query_scalar(
                    "INSERT INTO relayq_batches (queue, on_failure, created_at, name)
                     VALUES (?1, ?2, ?3, ?4) RETURNING id",
                )
                .bind(&fire.queue)
                .bind(on_failure.as_str())
                .bind(us(now))
                .bind(&fire.name)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?,
            )),
            None => None,
        };
        for job in &mut fire.jobs {
            job.batch = batch;
        }
        let jobs = enqueue_in(&mut tx, &fire.queue, &fire.jobs, now).await?;
        if let Some(b) = batch {
            sqlx::query("UPDATE relayq_batches SET sealed = 1 WHERE id = ?1")
                .bind(b.0)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        let made = Fired::Made { batch, jobs };
        if let Some(slot) = fire.slot {
            let (batch, job) = made.made().unwrap_or_default();
            sqlx::query(
                "UPDATE relayq_schedules SET mark = ?3,
                     last_slot = CASE WHEN ?4 THEN ?3 ELSE last_slot END,
                     last_job = CASE WHEN ?4 THEN ?5 ELSE last_job END,
                     last_batch = CASE WHEN ?4 THEN ?6 ELSE last_batch END
                 WHERE queue = ?1 AND name = ?2",
            )
            .bind(&fire.queue)
            .bind(&fire.name)
            .bind(us(slot))
            .bind(asked)
            .bind(job.map(|j| j.0))
            .bind(batch.map(|b| b.0))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        if asked {
            self.notify(&fire.queue, EventKind::Ready);
            if batch.is_some() {
                self.notify(&fire.queue, EventKind::Finished);
            }
        }
        Ok(made)
    }
}
