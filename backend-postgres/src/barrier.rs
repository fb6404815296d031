//! SPEC B: batches and their stages.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    Batch, BatchId, BatchProgress, Error, JobState, NewBatch, OnFailure, OrderBarrier, Result,
    StageProgress, WaitFor,
};

use crate::{PostgresBackend, db, listen};

#[async_trait]
impl OrderBarrier for PostgresBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        let (queue, on_failure, name) = (&batch.queue, batch.on_failure, batch.name.as_deref());
        let id: i64 = sqlx::query_scalar(self.sql(
            "INSERT INTO {s}.batches (queue, on_failure, name, after_failure)
             VALUES ($1, $2, $3, $4) RETURNING id",
        ))
        .bind(queue)
        .bind(on_failure.as_str())
        .bind(name)
        .bind(batch.after_failure.as_str())
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        Ok(Batch {
            queue: queue.to_owned(),
            id: BatchId(id),
        })
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        // Waiters for the whole batch re-check: sealing may be what completes it.
        let payload = format!("{}:{}", listen::FINISHED, batch.queue);
        let found: Option<i64> = sqlx::query_scalar(self.sql(
            "WITH sealed AS (
                 UPDATE {s}.batches SET sealed = true WHERE id = $1 AND queue = $2 RETURNING id),
             note AS (SELECT pg_notify($3, $4))
             SELECT sealed.id FROM sealed LEFT JOIN note ON true",
        ))
        .bind(batch.id.0)
        .bind(&batch.queue)
        .bind(self.inner.schema.channel())
        .bind(&payload)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        if found.is_none() {
            return Err(Error::not_found(batch.to_string()));
        }
        self.notify_local(&[payload]);
        Ok(())
    }

    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        // `jobs` holds only unfinished jobs, and `min` over the `jobs_stage` prefix is
        // one index probe, whatever the batch's size and whatever the plan. (`EXISTS`
        // with a stage bound got a sequential scan, generic plan and custom, once the
        // batch was most of the table.)
        let row: Option<(bool, Option<i32>)> = sqlx::query_as(self.sql(
            "SELECT b.sealed, (SELECT min(stage) FROM {s}.jobs WHERE batch_id = $1)
                 FROM {s}.batches b
                 WHERE b.id = $1 AND b.queue = $2",
        ))
        .bind(batch.id.0)
        .bind(&batch.queue)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let (sealed, low) = row.ok_or_else(|| Error::not_found(batch.to_string()))?;
        Ok(target.reached_at(sealed, low))
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        // One statement, one snapshot: a job moving from `jobs` to `finished` meanwhile
        // is counted once.
        let rows: Vec<(
            String,
            bool,
            bool,
            Option<i32>,
            Option<i32>,
            Option<String>,
            i64,
            DateTime<Utc>,
            Option<DateTime<Utc>>,
            Option<String>,
            String,
        )> = sqlx::query_as(self.sql(
            "SELECT b.on_failure, b.sealed, b.failed, b.released_stage, c.stage, c.state,
                        COALESCE(c.n, 0), b.created_at, c.fin, b.name, b.after_failure
                 FROM {s}.batches b
                 LEFT JOIN LATERAL (
                     SELECT stage, state, count(*) AS n, max(fin) AS fin FROM (
                         SELECT stage, state, NULL::timestamptz AS fin
                         FROM {s}.jobs WHERE batch_id = b.id
                         UNION ALL
                         SELECT stage, state, finished_at FROM {s}.finished
                         WHERE batch_id = b.id) u
                     GROUP BY stage, state) c ON true
                 WHERE b.id = $1 AND b.queue = $2",
        ))
        .bind(batch.id.0)
        .bind(&batch.queue)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let (on_failure, sealed, failed, released) = match rows.first() {
            Some((o, s, f, r, ..)) => (o.parse::<OnFailure>()?, *s, *f, *r),
            None => return Err(Error::not_found(batch.to_string())),
        };
        let created_at = rows.first().map(|r| r.7);
        let name = rows.first().and_then(|r| r.9.clone());
        let after_failure = match rows.first() {
            Some(r) => r.10.parse()?,
            None => relayq_core::AfterFailure::default(),
        };
        let last_finished_at = rows.iter().filter_map(|r| r.8).max();
        let mut counts = Vec::with_capacity(rows.len());
        for (_, _, _, _, stage, state, n, ..) in rows {
            if let (Some(stage), Some(state)) = (stage, state) {
                let n = u64::try_from(n).map_err(Error::backend)?;
                counts.push((stage, state.parse::<JobState>()?, n));
            }
        }
        Ok(BatchProgress {
            after_failure,
            batch: batch.clone(),
            on_failure,
            sealed,
            failed,
            released_stage: released,
            stages: StageProgress::tally(counts),
            name,
            created_at,
            last_finished_at,
        })
    }
}
