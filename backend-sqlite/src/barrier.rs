//! SPEC B: batches and their stages.

use async_trait::async_trait;
use relayq_core::{
    Batch, BatchId, BatchProgress, Error, EventKind, JobState, NewBatch, OrderBarrier, Result,
    StageProgress, WaitFor,
};

use crate::{SqliteBackend, db, us};

/// Whether batch `?1` of queue `?2` is sealed, and its lowest stage with an unfinished
/// job. `min` over the prefix of `relayq_jobs_stage`, whose rows are the unfinished
/// jobs, is one index probe: the state list must match the index's own for SQLite to
/// use it (the test below checks the plan). Pinned (`INDEXED BY`): the other index on
/// `batch_id`, `relayq_jobs_batch`, holds the batch's finished jobs too.
pub(crate) const REACHED: &str = "
    SELECT sealed,
           (SELECT min(stage) FROM relayq_jobs INDEXED BY relayq_jobs_stage
            WHERE batch_id = ?1 AND state IN ('ready', 'blocked', 'running', 'retrying'))
    FROM relayq_batches WHERE id = ?1 AND queue = ?2";

/// The batch row, for its progress.
pub(crate) const BATCH_SETTINGS: &str =
    "SELECT on_failure, sealed, failed, released_stage, created_at, name, after_failure
    FROM relayq_batches WHERE id = ?1 AND queue = ?2";

/// The batch's jobs counted by stage and state: every job of the batch, finished
/// ones included, which only `relayq_jobs_batch` holds.
pub(crate) const BATCH_COUNTS: &str =
    "SELECT stage, state, COUNT(*), MAX(finished_at) FROM relayq_jobs INDEXED BY relayq_jobs_batch
    WHERE batch_id = ?1 GROUP BY stage, state";

#[async_trait]
impl OrderBarrier for SqliteBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        let (mut tx, now) = self.write().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO relayq_batches (queue, on_failure, created_at, name, after_failure)
             VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
        )
        .bind(&batch.queue)
        .bind(batch.on_failure.as_str())
        .bind(us(now))
        .bind(batch.name.as_deref())
        .bind(batch.after_failure.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Batch {
            queue: batch.queue.clone(),
            id: BatchId(id),
        })
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        let (mut tx, _) = self.write().await?;
        let n = sqlx::query("UPDATE relayq_batches SET sealed = 1 WHERE id = ?1 AND queue = ?2")
            .bind(batch.id.0)
            .bind(&batch.queue)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        tx.commit().await.map_err(db)?;
        if n == 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        self.notify(&batch.queue, EventKind::Finished);
        Ok(())
    }

    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        let row: Option<(bool, Option<i32>)> = sqlx::query_as(REACHED)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(self.pool())
            .await
            .map_err(db)?;
        let (sealed, low) = row.ok_or_else(|| Error::not_found(batch.to_string()))?;
        Ok(target.reached_at(sealed, low))
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        type Settings = (String, bool, bool, Option<i64>, i64, Option<String>, String);
        let row: Option<Settings> = sqlx::query_as(BATCH_SETTINGS)
            .bind(batch.id.0)
            .bind(&batch.queue)
            .fetch_optional(self.pool())
            .await
            .map_err(db)?;
        let (on_failure, sealed, failed, released, created_at, name, after_failure) =
            row.ok_or_else(|| Error::not_found(batch.to_string()))?;
        let counts: Vec<(i64, String, i64, Option<i64>)> = sqlx::query_as(BATCH_COUNTS)
            .bind(batch.id.0)
            .fetch_all(self.pool())
            .await
            .map_err(db)?;
        let last_finished_at = counts.iter().filter_map(|r| r.3).max().map(crate::at);
        let rows = counts
            .into_iter()
            .map(|(stage, state, n, _)| {
                let stage = i32::try_from(stage).map_err(Error::backend)?;
                let n = u64::try_from(n).map_err(Error::backend)?;
                Ok((stage, state.parse::<JobState>()?, n))
            })
            .collect::<Result<Vec<_>>>()?;
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
            stages: StageProgress::tally(rows),
            name,
            created_at: Some(crate::at(created_at)),
            last_finished_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::SqliteBackend;

    /// `reached` probes the partial stage index, so `wait`'s checks cost the same at
    /// any batch size.
    #[tokio::test]
    async fn reached_probes_the_stage_index() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("plan.db").display());
        let backend = SqliteBackend::open(&url).await.unwrap();
        let explain = format!("EXPLAIN QUERY PLAN {}", super::REACHED);
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(explain))
            .bind(1_i64)
            .bind("q")
            .fetch_all(backend.pool())
            .await
            .unwrap();
        let detail: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(
            detail
                .iter()
                .any(|d| d.contains("INDEX relayq_jobs_stage (batch_id=?)")),
            "reached does not probe the stage index: {detail:?}"
        );
    }
}
