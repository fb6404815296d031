//! SPEC S: schedules (S1, S2, S5). A slot fires in one write transaction (S2): the
//! queue's lock (`lock.rs`), then the schedule's row locked, judged
//! (`kit::fire::refusal`), its mark moved, the slot's jobs stored (in a batch opened
//! and sealed for them when asked) and what it made recorded, so a crash between any
//! two of these cannot happen.
//!
//! Storing, pausing and deleting a schedule are one statement each (run again after a
//! deadlock), which locks the schedule's row and no queue's; a fire holds that row from
//! its read to its commit, so none of them lands between the judging and the mark's
//! move.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    BatchId, Error, JobId, NewBatch, NewJob, Result, Schedules,
    kit::fire::refusal,
    retry::retry_transient,
    schedule::{Fire, Fired, StoredSchedule},
};

use crate::{
    Conn, MysqlBackend, at,
    barrier::{open_in, seal_in},
    db,
    enqueue::enqueue_in,
    us,
};

/// SPEC S1: a new schedule at version 1 with its mark at `starting`, or the server's
/// time (`lock::NOW_US`); a replacement takes the new definition and the next version
/// and keeps its mark and pause flag, so no slot fires twice.
const PUT: &str = "INSERT INTO relayq_schedules (queue, name, definition, version, mark)
    VALUES (?, ?, ?, 1, COALESCE(?, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)))
    ON DUPLICATE KEY UPDATE definition = VALUES(definition), version = version + 1";

/// SPEC S5: the queue's schedules by name. Text is cast to the connection's character
/// set, which sqlx decodes as `String` (the columns are in a binary collation).
const LIST: &str = "SELECT CAST(name AS CHAR) AS name, CAST(definition AS CHAR) AS definition,
        version, mark, paused, last_slot, last_job, last_batch
    FROM relayq_schedules WHERE queue = ? ORDER BY name";

/// SPEC S5: no slot fires after; the jobs it made stay.
const DELETE: &str = "DELETE FROM relayq_schedules WHERE queue = ? AND name = ?";

/// SPEC S5: pauses or resumes. sqlx asks the server for rows matched, not changed
/// (`CLIENT_FOUND_ROWS`), so pausing twice still finds the schedule.
const PAUSE: &str = "UPDATE relayq_schedules SET paused = ? WHERE queue = ? AND name = ?";

/// SPEC S2: what a slot is judged on, its row held until the fire commits, so no
/// replacement or pause lands between the judging and the mark's move.
const FIRE_LOCK: &str = "SELECT version, mark, paused FROM relayq_schedules
    WHERE queue = ? AND name = ? FOR UPDATE";

/// SPEC S5: "run now" moves no mark and ignores the pause: it only reads the version.
const FIRE_READ: &str = "SELECT version, mark, paused FROM relayq_schedules
    WHERE queue = ? AND name = ?";

/// SPEC S2, S3: a slot that enqueued nothing (passed over by the policy) moves only
/// the mark.
const MOVE_MARK: &str = "UPDATE relayq_schedules SET mark = ? WHERE queue = ? AND name = ?";

/// SPEC S2, S5: a slot that enqueued moves the mark and records itself and what it
/// made (its batch, or its first job stored).
const RECORD_SLOT: &str = "UPDATE relayq_schedules
    SET mark = ?, last_slot = ?, last_job = ?, last_batch = ?
    WHERE queue = ? AND name = ?";

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

impl MysqlBackend {
    /// One try at firing: the whole transaction, which the caller runs again after a
    /// deadlock.
    async fn fire_once(&self, fire: &Fire) -> Result<Fired> {
        let (mut tx, now) = self.write(&[&fire.queue]).await?;
        let read = if fire.slot.is_some() {
            FIRE_LOCK
        } else {
            FIRE_READ
        };
        let row: Option<(i64, i64, bool)> = sqlx::query_as(read)
            .bind(&fire.queue)
            .bind(&fire.name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let refused = match row {
            None => Some(Fired::Gone),
            Some((version, mark, paused)) => refusal(fire, version, at(mark), paused, at(now)),
        };
        if let Some(no) = refused {
            // Ended now, not when dropped: a dropped transaction rolls back only once
            // its connection is next used, holding the queue's lock until then.
            tx.rollback().await.map_err(db)?;
            return Ok(no);
        }
        let made = make(&mut tx, fire, now, self.inner.id_step).await?;
        if let Some(slot) = fire.slot {
            record(&mut tx, fire, us(slot), &made).await?;
        }
        tx.commit().await.map_err(db)?;
        Ok(made)
    }
}

/// Stores the slot's jobs (SPEC S1, S2): in a new batch named after the schedule,
/// sealed once they are in, when the fire asks for one. `step` is the server's
/// `auto_increment_increment`, as `enqueue_in` takes it.
async fn make(c: &mut Conn, fire: &Fire, now: i64, step: i64) -> Result<Fired> {
    if fire.jobs.is_empty() {
        return Ok(Fired::Made {
            batch: None,
            jobs: Vec::new(),
        });
    }
    let Some(on_failure) = fire.batch else {
        let jobs = enqueue_in(c, &fire.queue, &fire.jobs, now, step).await?;
        return Ok(Fired::Made { batch: None, jobs });
    };
    let new = NewBatch::new(fire.queue.as_str())
        .on_failure(on_failure)
        .name(fire.name.as_str());
    let batch = open_in(c, &new, now).await?;
    let jobs: Vec<NewJob> = fire
        .jobs
        .iter()
        .cloned()
        .map(|mut job| {
            job.batch = Some(batch.id);
            job
        })
        .collect();
    let jobs = enqueue_in(c, &fire.queue, &jobs, now, step).await?;
    if !seal_in(c, &batch).await? {
        return Err(Error::backend(
            "the batch a schedule's slot opened was not found",
        ));
    }
    Ok(Fired::Made {
        batch: Some(batch.id),
        jobs,
    })
}

/// Moves the schedule's mark to `slot` (SPEC S2) and, when the slot enqueued, records
/// it with what it made.
async fn record(c: &mut Conn, fire: &Fire, slot: i64, made: &Fired) -> Result<()> {
    let query = if fire.jobs.is_empty() {
        sqlx::query(MOVE_MARK).bind(slot)
    } else {
        let (batch, job) = made.made().unwrap_or_default();
        sqlx::query(RECORD_SLOT)
            .bind(slot)
            .bind(slot)
            .bind(job.map(|j| j.0))
            .bind(batch.map(|b| b.0))
    };
    query
        .bind(&fire.queue)
        .bind(&fire.name)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

#[async_trait]
impl Schedules for MysqlBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let put = || async {
            sqlx::query(PUT)
                .bind(queue)
                .bind(name)
                .bind(definition)
                .bind(starting.map(us))
                .execute(&self.inner.pool)
                .await
                .map_err(db)
        };
        retry_transient(put, crate::deadlocked).await?;
        Ok(())
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        let rows: Vec<Row> = sqlx::query_as(LIST)
            .bind(queue)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        // The server's clock, which judges every slot: not this process's.
        let now = self.now().await?;
        Ok((rows.into_iter().map(Into::into).collect(), at(now)))
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        let delete = || async {
            sqlx::query(DELETE)
                .bind(queue)
                .bind(name)
                .execute(&self.inner.pool)
                .await
                .map_err(db)
        };
        let n = retry_transient(delete, crate::deadlocked)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        let pause = || async {
            sqlx::query(PAUSE)
                .bind(paused)
                .bind(queue)
                .bind(name)
                .execute(&self.inner.pool)
                .await
                .map_err(db)
        };
        let n = retry_transient(pause, crate::deadlocked)
            .await?
            .rows_affected();
        if n == 0 {
            return Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            )));
        }
        Ok(())
    }

    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired> {
        retry_transient(|| self.fire_once(&fire), crate::deadlocked).await
    }
}
