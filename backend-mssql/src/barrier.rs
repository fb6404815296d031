//! SPEC B: batches and their stages.

use async_trait::async_trait;
use relayq_core::{
    Batch, BatchId, BatchProgress, Error, JobState, NewBatch, OnFailure, OrderBarrier, Result,
    StageProgress, WaitFor,
};

use crate::{
    MssqlBackend,
    rows::{self, num, req},
    sql,
};

#[async_trait]
impl OrderBarrier for MssqlBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        // Dependencies are not kept here yet: a policy for them would not apply.
        relayq_core::kit::after::refuse_policy(batch)?;
        let (queue, on_failure, name) = (
            batch.queue.as_str(),
            batch.on_failure,
            batch.name.as_deref(),
        );
        let sets = self
            .run(sql::OPEN_BATCH, &[&queue, &on_failure.as_str(), &name])
            .await?;
        let id = rows::set(&sets, 0)?
            .first()
            .map(|r| req::<i64>(r, 0))
            .transpose()?
            .ok_or_else(|| Error::backend("opening a batch returned no id"))?;
        Ok(Batch {
            queue: queue.to_owned(),
            id: BatchId(id),
        })
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        let sets = self
            .run(sql::SEAL, &[&batch.id.0, &batch.queue.as_str()])
            .await?;
        if rows::set(&sets, 0)?.is_empty() {
            return Err(Error::not_found(batch.to_string()));
        }
        // Waiters for the whole batch re-check: sealing may be what completes it.
        self.inner
            .events
            .notify(&batch.queue, relayq_core::EventKind::Finished);
        Ok(())
    }

    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        let sets = self
            .run(sql::REACHED, &[&batch.id.0, &batch.queue.as_str()])
            .await?;
        let Some(row) = rows::set(&sets, 0)?.first() else {
            return Err(Error::not_found(batch.to_string()));
        };
        Ok(target.reached_at(req(row, 0)?, rows::get(row, 1)?))
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        let sets = self
            .run(sql::BATCH_PROGRESS, &[&batch.id.0, &batch.queue.as_str()])
            .await?;
        let found = rows::set(&sets, 0)?;
        let Some(first) = found.first() else {
            return Err(Error::not_found(batch.to_string()));
        };
        let on_failure: OnFailure = req::<&str>(first, 0)?.parse()?;
        let created_at = rows::time_opt(first, 7)?;
        let name = rows::get::<&str>(first, 9)?.map(str::to_owned);
        let mut last_finished_at = None;
        for r in found {
            last_finished_at = last_finished_at.max(rows::time_opt(r, 8)?);
        }
        let mut counts = Vec::with_capacity(found.len());
        for r in found {
            if let (Some(stage), Some(state)) = (rows::get::<i32>(r, 4)?, rows::get::<&str>(r, 5)?)
            {
                let n: u64 = num(req::<i64>(r, 6)?)?;
                counts.push((stage, state.parse::<JobState>()?, n));
            }
        }
        Ok(BatchProgress {
            after_failure: relayq_core::AfterFailure::default(),
            batch: batch.clone(),
            on_failure,
            sealed: req(first, 1)?,
            failed: req(first, 2)?,
            released_stage: rows::get(first, 3)?,
            stages: StageProgress::tally(counts),
            name,
            created_at,
            last_finished_at,
        })
    }
}
