//! SPEC B: batches and their stages (B1, B4, B5, M1). Opening and sealing write under
//! the queue's lock (`lock.rs`); [`open_in`] and [`seal_in`] also serve a schedule's
//! slot (SPEC S1), inside the transaction that fires it.

use async_trait::async_trait;
use relayq_core::{
    Batch, BatchId, BatchProgress, Error, JobState, NewBatch, OrderBarrier, Result, StageProgress,
    WaitFor, retry::retry_transient,
};

use crate::{Conn, MysqlBackend, at, db};

/// SPEC B1: a new batch, unsealed, stamped with the server's time. Its id is the
/// insert's (`last_insert_id`): MySQL has no `RETURNING`.
const OPEN: &str = "INSERT INTO relayq_batches (queue, on_failure, created_at, name,
        after_failure)
    VALUES (?, ?, ?, ?, ?)";

/// SPEC B4: no more jobs. Sealing twice matches the row again: sqlx asks the server
/// for rows matched, not changed (`CLIENT_FOUND_ROWS`), so only an unknown batch
/// affects none.
const SEAL: &str = "UPDATE relayq_batches SET sealed = TRUE WHERE id = ? AND queue = ?";

/// SPEC B5: whether the batch is sealed, and its lowest stage with an unfinished job.
/// `live_batch` holds the batch of unfinished jobs only, so `MIN(stage)` over the
/// `(live_batch, stage)` index with the id bound (not correlated to the outer row) is
/// one probe, whatever the batch's size.
const REACHED: &str = "SELECT sealed,
        (SELECT MIN(stage) FROM relayq_jobs WHERE live_batch = ?)
    FROM relayq_batches WHERE id = ? AND queue = ?";

/// SPEC M1: the batch's row, for its progress. Text is cast to the connection's
/// character set, which sqlx decodes as `String` (the columns are in a binary collation).
const BATCH_SETTINGS: &str = "SELECT CAST(on_failure AS CHAR), sealed, failed, released_stage,
        created_at, CAST(name AS CHAR), CAST(after_failure AS CHAR)
    FROM relayq_batches WHERE id = ? AND queue = ?";

/// SPEC B5, M1: the batch's jobs counted by stage and state, finished ones included,
/// which only `relayq_jobs_batch (batch_id, id)` holds (`live_batch` drops them).
const BATCH_COUNTS: &str = "SELECT stage, CAST(state AS CHAR), COUNT(*), MAX(finished_at)
    FROM relayq_jobs WHERE batch_id = ? GROUP BY stage, state";

/// The batch's settings as stored: on_failure, sealed, failed, released stage,
/// created at, name, dependency policy (SPEC D4).
type Settings = (String, bool, bool, Option<i64>, i64, Option<String>, String);

/// One group of [`BATCH_COUNTS`]: stage, state, jobs, the last of them to finish.
type Count = (i64, String, i64, Option<i64>);

/// Opens `batch` inside the caller's write transaction, which holds its queue's lock
/// (SPEC B1, D4); `now` is the server's time.
pub(crate) async fn open_in(c: &mut Conn, batch: &NewBatch, now: i64) -> Result<Batch> {
    let done = sqlx::query(OPEN)
        .bind(&batch.queue)
        .bind(batch.on_failure.as_str())
        .bind(now)
        .bind(batch.name.as_deref())
        .bind(batch.after_failure.as_str())
        .execute(&mut *c)
        .await
        .map_err(db)?;
    let id = i64::try_from(done.last_insert_id()).map_err(Error::backend)?;
    Ok(Batch {
        queue: batch.queue.clone(),
        id: BatchId(id),
    })
}

/// Seals `batch` inside the caller's write transaction (SPEC B4); `false` when the
/// queue has no such batch. Sealing releases nothing: the stages move when jobs
/// finish, and a waiter for the whole batch reads `sealed` again.
pub(crate) async fn seal_in(c: &mut Conn, batch: &Batch) -> Result<bool> {
    let n = sqlx::query(SEAL)
        .bind(batch.id.0)
        .bind(&batch.queue)
        .execute(&mut *c)
        .await
        .map_err(db)?
        .rows_affected();
    Ok(n > 0)
}

impl MysqlBackend {
    /// One try at opening a batch: its own write transaction.
    async fn open_once(&self, batch: &NewBatch) -> Result<Batch> {
        let (mut tx, now) = self.write(&[&batch.queue]).await?;
        let opened = open_in(&mut tx, batch, now).await?;
        tx.commit().await.map_err(db)?;
        Ok(opened)
    }

    /// One try at sealing a batch: its own write transaction, rolled back when the
    /// queue has no such batch (so the queue's row `write` made is not kept either).
    async fn seal_once(&self, batch: &Batch) -> Result<bool> {
        let (mut tx, _) = self.write(&[&batch.queue]).await?;
        let found = seal_in(&mut tx, batch).await?;
        if found {
            tx.commit().await.map_err(db)?;
        } else {
            tx.rollback().await.map_err(db)?;
        }
        Ok(found)
    }

    /// The batch's settings, `NotFound` for a batch the queue does not have.
    async fn batch_settings(&self, batch: &Batch) -> Result<Settings> {
        let row: Option<Settings> = sqlx::query_as(BATCH_SETTINGS)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        row.ok_or_else(|| Error::not_found(batch.to_string()))
    }
}

#[async_trait]
impl OrderBarrier for MysqlBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        retry_transient(|| self.open_once(batch), crate::deadlocked).await
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        if retry_transient(|| self.seal_once(batch), crate::deadlocked).await? {
            Ok(())
        } else {
            Err(Error::not_found(batch.to_string()))
        }
    }

    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        let row: Option<(bool, Option<i64>)> = sqlx::query_as(REACHED)
            .bind(batch.id.0)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        let (sealed, low) = row.ok_or_else(|| Error::not_found(batch.to_string()))?;
        let low = low.map(i32::try_from).transpose().map_err(Error::backend)?;
        Ok(target.reached_at(sealed, low))
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        let (on_failure, sealed, failed, released, created_at, name, after_failure) =
            self.batch_settings(batch).await?;
        let counts: Vec<Count> = sqlx::query_as(BATCH_COUNTS)
            .bind(batch.id.0)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        let last_finished_at = counts.iter().filter_map(|r| r.3).max().map(at);
        Ok(BatchProgress {
            batch: batch.clone(),
            on_failure: on_failure.parse()?,
            after_failure: after_failure.parse()?,
            sealed,
            failed,
            released_stage: released
                .map(i32::try_from)
                .transpose()
                .map_err(Error::backend)?,
            stages: StageProgress::tally(tally_rows(counts)?),
            name,
            created_at: Some(at(created_at)),
            last_finished_at,
        })
    }
}

/// [`BATCH_COUNTS`]' rows as `StageProgress::tally` takes them.
fn tally_rows(counts: Vec<Count>) -> Result<Vec<(i32, JobState, u64)>> {
    counts
        .into_iter()
        .map(|(stage, state, n, _)| {
            let stage = i32::try_from(stage).map_err(Error::backend)?;
            let n = u64::try_from(n).map_err(Error::backend)?;
            Ok((stage, state.parse::<JobState>()?, n))
        })
        .collect()
}
