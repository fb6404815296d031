//! SPEC M1, M2, X1: reading queues, jobs and their log.

use async_trait::async_trait;
use relayq_core::{
    AttemptOutcome, AttemptRecord, Batch, BatchId, BatchProgress, Error, Inspect, JobFilter, JobId,
    JobInfo, JobPage, JobState, LIST_SCAN, Progress, QueueStats, Result, RunningJob,
};

use crate::{
    MssqlBackend, keys,
    rows::{self, num, req},
    sql,
};

impl MssqlBackend {
    /// The ids a listing statement (`@P1` queue, `@P2` limit) returns.
    async fn ids(&self, template: &'static str, queue: &str, limit: u32) -> Result<Vec<i64>> {
        let limit = i64::from(limit);
        let sets = self.run(template, &[&queue, &limit]).await?;
        rows::set(&sets, 0)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect()
    }
}

#[async_trait]
impl Inspect for MssqlBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        let sets = self.run(sql::QUEUE_STATS, &[&queue]).await?;
        let settings = rows::set(&sets, 1)?.first();
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            paused: settings
                .map(|r| req::<bool>(r, 0))
                .transpose()?
                .unwrap_or(false),
            max_running: settings
                .map(|r| rows::get::<i32>(r, 1))
                .transpose()?
                .flatten()
                .map(num)
                .transpose()?,
            ..QueueStats::default()
        };
        for r in rows::set(&sets, 0)? {
            let state: JobState = req::<&str>(r, 0)?.parse()?;
            *stats.counts.entry(state).or_default() += num::<u64, _>(req::<i64>(r, 1)?)?;
            if let Some(t) = rows::time_opt(r, 2)? {
                stats.oldest_ready = Some(stats.oldest_ready.map_or(t, |o| o.min(t)));
            }
        }
        Ok(stats)
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let sets = self.run(sql::QUEUES, &[]).await?;
        rows::set(&sets, 0)?
            .iter()
            .map(|r| req::<&str>(r, 0).map(str::to_owned))
            .collect()
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        let sets = self.run(sql::JOB, &[&id.0, &queue]).await?;
        let Some(r) = rows::set(&sets, 0)?.first() else {
            return Err(Error::not_found(format!("job {id} in queue {queue:?}")));
        };
        let mut log = rows::set(&sets, 1)?
            .iter()
            .map(|a| {
                Ok(AttemptRecord {
                    attempt: num(req::<i16>(a, 0)?)?,
                    worker: req::<&str>(a, 1)?.to_owned(),
                    started_at: rows::time(a, 2)?,
                    claimed_at: rows::time_opt(a, 7)?,
                    ended_at: Some(rows::time(a, 3)?),
                    outcome: req::<&str>(a, 4)?.parse()?,
                    error: rows::text(a, 5)?,
                    output: rows::text(a, 6)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let state: JobState = req::<&str>(r, 1)?.parse()?;
        let attempts: u32 = num(req::<i16>(r, 5)?)?;
        let created_at = rows::time(r, 12)?;
        if state == JobState::Running {
            // The running attempt lives on the job row until it ends.
            log.push(AttemptRecord {
                attempt: attempts,
                worker: rows::text(r, 15)?.unwrap_or_default(),
                started_at: rows::time_opt(r, 16)?.unwrap_or(created_at),
                claimed_at: rows::time_opt(r, 16)?,
                ended_at: None,
                outcome: AttemptOutcome::Running,
                error: None,
                output: None,
            });
        }
        Ok(JobInfo {
            after: Vec::new(),
            id,
            queue: queue.to_owned(),
            state,
            payload: req::<&[u8]>(r, 2)?.to_vec(),
            priority: req(r, 3)?,
            run_at: rows::time(r, 4)?,
            attempts,
            max_attempts: num(req::<i16>(r, 6)?)?,
            group: rows::get::<&str>(r, 7)?.map(keys::load),
            batch: rows::get(r, 8)?.map(BatchId),
            stage: rows::get(r, 9)?,
            dedupe_key: rows::get::<&str>(r, 10)?.map(keys::load),
            enqueued_by: rows::text(r, 11)?,
            created_at,
            finished_at: rows::time_opt(r, 13)?,
            last_error: rows::text(r, 14)?,
            attempt_log: log,
            progress: rows::text(r, 17)?
                .as_deref()
                .and_then(Progress::from_stored),
            limit_key: None,
        })
    }

    /// No key has a limit here: this backend does not keep limit keys yet (SPEC K1).
    async fn key_limits_unchecked(&self, _queue: &str) -> Result<relayq_core::KeyLimits> {
        Ok(relayq_core::KeyLimits::default())
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        let sets = self.run(sql::RUNNING, &[&queue]).await?;
        rows::set(&sets, 0)?
            .iter()
            .map(|r| {
                Ok(RunningJob {
                    id: JobId(req(r, 0)?),
                    worker: rows::text(r, 1)?.unwrap_or_default(),
                    attempt: num(req::<i16>(r, 2)?)?,
                    started_at: rows::time(r, 3)?,
                    lease_expires_at: rows::time(r, 4)?,
                    progress: rows::text(r, 5)?.as_deref().and_then(Progress::from_stored),
                })
            })
            .collect()
    }

    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        let sets = self
            .run(sql::GROUP_HOLDER, &[&queue, &keys::store(group).as_str()])
            .await?;
        rows::set(&sets, 0)?
            .first()
            .map(|r| req::<i64>(r, 0).map(JobId))
            .transpose()
    }

    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        let ids = self.ids(sql::BATCH_IDS, queue, limit).await?;
        relayq_core::listing::batches(self, queue, ids).await
    }

    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        let after = after.map_or(i64::MIN, |a| a.0);
        let limit = i64::from(limit);
        let sets = self
            .run(
                sql::BATCH_JOB_IDS,
                &[&batch.id.0, &batch.queue.as_str(), &after, &limit],
            )
            .await?;
        let known = rows::set(&sets, 0)?
            .first()
            .map(|r| req::<i64>(r, 0))
            .transpose()?
            .unwrap_or(0);
        if known == 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        rows::set(&sets, 1)?
            .iter()
            .map(|r| req::<i64>(r, 0).map(JobId))
            .collect()
    }

    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<relayq_core::WorkerSeen>> {
        self.seen(queue).await
    }

    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage> {
        let before = before.map_or(i64::MAX, |b| b.0);
        let state = filter.state.map(JobState::as_str);
        let batch = filter.batch.map(|b| b.0);
        let needle = filter.text.as_ref().map(|t| t.as_bytes().to_vec());
        let rows_wanted = i64::from(limit) + 1;
        let scan = i64::from(LIST_SCAN);
        let sets = self
            .run(
                sql::LIST_JOBS,
                &[
                    &queue,
                    &before,
                    &state,
                    &batch,
                    &filter.stage,
                    &filter.group.as_deref(),
                    &needle,
                    &filter.text.as_deref(),
                    &rows_wanted,
                    &scan,
                ],
            )
            .await?;
        let rows = rows::set(&sets, 0)?
            .iter()
            .map(|r| Ok((req::<i64>(r, 0)?, req::<i32>(r, 1)? == 1, req::<i64>(r, 2)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(JobPage::from_scan(rows, limit))
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        let ids = self.ids(sql::DEAD_IDS, queue, limit).await?;
        relayq_core::listing::jobs(self, queue, ids).await
    }
}
