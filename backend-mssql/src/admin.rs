//! SPEC M: pause, limits, cancel, revive, maintenance.

use std::time::Duration;

use async_trait::async_trait;
use relayq_core::{
    Admin, Batch, Error, EventKind, JobId, Maintenance, QueueUpdate, Result, cancelled_by, kit,
};

use crate::{
    MssqlBackend,
    rows::{self, num, req},
    sql,
};

/// Finished jobs pruned per transaction, to keep each transaction short. The attempts
/// of 1,000 jobs can exceed the 5,000 locks per statement at which SQL Server would
/// escalate to a table lock (a job has up to `max_attempts` log rows); escalation is
/// off on the queue tables (migration 2), so that costs lock memory, not a table lock.
const PRUNE_CHUNK: i32 = 1_000;

impl MssqlBackend {
    async fn set_queue(
        &self,
        queue: &str,
        paused: Option<bool>,
        max: Option<Option<u32>>,
    ) -> Result<()> {
        let max_value = max.flatten().map(|m| i32::try_from(m).unwrap_or(i32::MAX));
        let set_max = max.is_some();
        self.run(sql::SET_QUEUE, &[&queue, &paused, &set_max, &max_value])
            .await?;
        self.inner.events.notify(queue, EventKind::Ready);
        Ok(())
    }

    /// SPEC C5: running jobs of `queue` whose lease expired retry in place, or,
    /// without attempts left, are dead. With `all` false, only the dead-bound ones (the
    /// claim takes the others over itself). Returns (requeued, dead).
    pub(crate) async fn expire(&self, queue: &str, all: bool) -> Result<(u64, u64)> {
        let sets = self.run(sql::EXPIRE, &[&queue, &all]).await?;
        let r = rows::set(&sets, 0)?
            .first()
            .ok_or_else(|| Error::backend("expire returned no counts"))?;
        let counts = (num(req::<i32>(r, 0)?)?, num(req::<i32>(r, 1)?)?);
        self.wake(rows::set(&sets, 1)?)?;
        Ok(counts)
    }

    /// SPEC M3: deletes finished jobs of `queue` older than `retention`, with their
    /// log, in chunks; then sealed batches left without jobs.
    async fn prune(&self, queue: &str, retention: Duration) -> Result<u64> {
        // Beyond a century, keep everything.
        let (days, ms) = rows::split(retention.min(Duration::from_secs(100 * 365 * 86_400)));
        let mut pruned = 0;
        loop {
            let sets = self
                .run(sql::PRUNE, &[&queue, &days, &ms, &PRUNE_CHUNK])
                .await?;
            let n = rows::set(&sets, 0)?
                .first()
                .map(|r| req::<i32>(r, 0))
                .transpose()?
                .unwrap_or(0);
            pruned += num::<u64, _>(n)?;
            if n < PRUNE_CHUNK {
                break;
            }
        }
        self.run(sql::PRUNE_BATCHES, &[&queue]).await?;
        Ok(pruned)
    }
}

#[async_trait]
impl Admin for MssqlBackend {
    /// SPEC K1: refused, as a job with a limit key is (`Limits::limit_keys` is false).
    async fn set_key_limit_unchecked(
        &self,
        _queue: &str,
        _key: Option<&str>,
        _limit: Option<u32>,
    ) -> Result<()> {
        Err(Error::invalid(
            "limit_key",
            "the SQL Server backend does not keep limit keys yet",
        ))
    }

    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        // Rates are not written for SQL Server yet: refused before anything is stored
        // (SPEC K8), the way a limit key is.
        relayq_core::validate::rate_kept(&update, &relayq_core::Enqueue::limits(self))?;
        self.set_queue(queue, update.paused, update.max_running)
            .await
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        self.cancel_job_as(queue, id, cancelled_by::JOB).await
    }
    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        self.cancel_batch_as(batch, cancelled_by::BATCH).await
    }

    /// Each batch in a transaction of its own, then the other jobs one by one, a
    /// hundred found at a time; only jobs up to the newest id at the start, so a steady
    /// stream of enqueues cannot keep it going.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let sets = self.run(sql::PURGE_BATCHES, &[&queue]).await?;
        let newest: Option<i64> = match rows::set(&sets, 0)?.first() {
            Some(r) => rows::get(r, 0)?,
            None => None,
        };
        let Some(newest) = newest else { return Ok(0) };
        let batches = rows::set(&sets, 1)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect::<Result<Vec<_>>>()?;
        let batch = |b: Batch| async move { self.cancel_batch_as(&b, cancelled_by::PURGE).await };
        kit::purge::purge(queue, batches, batch, || self.purge_step(queue, newest)).await
    }

    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let ids = ids_json(ids);
        let sets = self.run(sql::DELETE_JOBS, &[&queue, &ids.as_str()]).await?;
        first_count(&sets)
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let ids = ids_json(ids);
        let sets = self.run(sql::RUN_NOW, &[&queue, &ids.as_str()]).await?;
        let n = first_count(&sets)?;
        if n > 0 {
            self.inner.events.notify(queue, EventKind::Ready);
        }
        Ok(n)
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let ids: Option<String> = ids.map(ids_json);
        let sets = self
            .run(sql::RETRY_DEAD, &[&queue, &ids.as_deref()])
            .await?;
        let n = first_count(&sets)?;
        self.wake(rows::set(&sets, 1)?)?;
        Ok(n)
    }

    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        let (requeued, dead) = self.expire(queue, true).await?;
        let pruned = self.prune(queue, retention).await?;
        Ok(Maintenance {
            requeued,
            dead,
            pruned,
        })
    }
}

impl MssqlBackend {
    /// SPEC B9: up to 100 unfinished jobs of no batch up to `newest`, last in claim
    /// order first, each cancelled in a transaction of its own; `None` once none is
    /// left. A job that finished meanwhile is not counted.
    async fn purge_step(&self, queue: &str, newest: i64) -> Result<Option<u64>> {
        let sets = self.run(sql::PURGE_JOBS, &[&queue, &newest]).await?;
        let ids = rows::set(&sets, 0)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect::<Result<Vec<_>>>()?;
        if ids.is_empty() {
            return Ok(None);
        }
        let mut n = 0;
        for id in ids {
            match self
                .cancel_job_as(queue, JobId(id), cancelled_by::PURGE)
                .await
            {
                Ok(cancelled) => n += u64::from(cancelled),
                // Pruned since it was found.
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some(n))
    }

    /// SPEC B7: cancels one job; `why` goes to the log of the attempt it cuts short.
    async fn cancel_job_as(&self, queue: &str, id: JobId, why: &str) -> Result<bool> {
        let sets = self.run(sql::CANCEL_JOB, &[&id.0, &queue, &why]).await?;
        let found = rows::set(&sets, 0)?
            .first()
            .map(|r| rows::get::<&str>(r, 0))
            .transpose()?
            .flatten()
            .map(str::to_owned);
        self.wake(rows::set(&sets, 1)?)?;
        if found.as_deref() == Some("running") {
            // Workers of this process stop it now; others read their leases (SPEC B8).
            self.inner.events.notify(queue, EventKind::Revoked);
        }
        match found.as_deref() {
            None => Err(Error::not_found(format!("job {id} in queue {queue:?}"))),
            Some("ready" | "blocked" | "running" | "retrying") => Ok(true),
            Some(_) => Ok(false),
        }
    }

    /// SPEC B7: seals the batch and cancels its unfinished jobs; `why` goes to the log
    /// of each running attempt it cuts short.
    async fn cancel_batch_as(&self, batch: &Batch, why: &str) -> Result<u64> {
        let sets = self
            .run(
                sql::CANCEL_BATCH,
                &[&batch.id.0, &batch.queue.as_str(), &why],
            )
            .await?;
        let r = rows::set(&sets, 0)?
            .first()
            .ok_or_else(|| Error::backend("cancel returned no counts"))?;
        self.wake(rows::set(&sets, 1)?)?;
        if req::<i32>(r, 0)? == 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        if req::<i32>(r, 1)? > 0 {
            self.inner.events.notify(&batch.queue, EventKind::Revoked);
        }
        num(req::<i32>(r, 1)?)
    }
}

/// Job ids as the JSON array the statements read with `OPENJSON`.
fn ids_json(ids: &[JobId]) -> String {
    serde_json::Value::from(ids.iter().map(|id| id.0).collect::<Vec<_>>()).to_string()
}

/// The count in the first column of the first result set's first row, 0 when there is
/// none (the statements that change jobs by id end with one).
fn first_count(sets: &[Vec<tiberius::Row>]) -> Result<u64> {
    let n = rows::set(sets, 0)?
        .first()
        .map(|r| req::<i32>(r, 0))
        .transpose()?
        .unwrap_or(0);
    num(n)
}
