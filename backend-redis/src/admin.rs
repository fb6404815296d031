//! SPEC B, M, C6, B7: batches, reads and operating queues.

use std::{collections::BTreeMap, time::Duration};

use async_trait::async_trait;
use redis::Value;
use relayq_core::{
    Admin, AttemptOutcome, AttemptRecord, Batch, BatchId, BatchProgress, Error, EventKind, Inspect,
    JobFilter, JobId, JobInfo, JobPage, JobState, KEYS_LISTED, KeyLimits, KeyUse, Maintenance,
    NewBatch, OrderBarrier, Progress, QueueStats, QueueUpdate, Result, RunningJob, StageProgress,
    WaitFor, cancelled_by,
};
use serde::Deserialize;

use crate::{
    RedisBackend, arg, micros,
    reply::{self, bad, int, text},
    scripts,
};

#[async_trait]
impl OrderBarrier for RedisBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        let (queue, on_failure, name) = (&batch.queue, batch.on_failure, batch.name.as_deref());
        self.register(queue).await?;
        let args = [
            b"open".to_vec(),
            on_failure.as_str().as_bytes().to_vec(),
            name.unwrap_or_default().as_bytes().to_vec(),
            batch.after_failure.as_str().as_bytes().to_vec(),
        ];
        let id: i64 = self.run(&scripts::BATCH, queue, &args).await?;
        Ok(Batch {
            queue: queue.to_owned(),
            id: BatchId(id),
        })
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        let args = [b"seal".to_vec(), arg(batch.id.0)];
        let found: i64 = self.run(&scripts::BATCH, &batch.queue, &args).await?;
        if found < 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        self.notify_local(&batch.queue, EventKind::Finished);
        Ok(())
    }

    async fn reached_unchecked(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        let items = self.read_batch(b"reached", batch).await?;
        let [sealed, low] = items.as_slice() else {
            return Err(bad("batch reached"));
        };
        Ok(target.reached_at(text(sealed)? == "1", opt_stage(low)?))
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        let items = self.read_batch(b"progress", batch).await?;
        if items.len() < 8 {
            return Err(bad("batch progress"));
        }
        let time = |v: &Value| -> Result<Option<chrono::DateTime<chrono::Utc>>> {
            reply::opt_text(v)?
                .map(|t| t.parse::<i64>().map(reply::time).map_err(Error::backend))
                .transpose()
        };
        let mut counts = Vec::new();
        for triple in items[8..].chunks(3) {
            let [stage, state, n] = triple else {
                return Err(bad("batch progress"));
            };
            let stage: i32 = text(stage)?.parse().map_err(Error::backend)?;
            let n = u64::try_from(int(n)?).map_err(Error::backend)?;
            counts.push((stage, text(state)?.parse::<JobState>()?, n));
        }
        Ok(BatchProgress {
            after_failure: text(&items[7])?.parse()?,
            batch: batch.clone(),
            on_failure: text(&items[0])?.parse()?,
            sealed: text(&items[1])? == "1",
            failed: text(&items[2])? == "1",
            released_stage: opt_stage(&items[3])?,
            stages: StageProgress::tally(counts),
            name: reply::opt_text(&items[6])?,
            created_at: time(&items[4])?,
            last_finished_at: time(&items[5])?,
        })
    }
}

impl RedisBackend {
    /// The batch script's read `op` of `batch`: its reply's items, or
    /// [`Error::NotFound`].
    async fn read_batch(&self, op: &[u8], batch: &Batch) -> Result<Vec<Value>> {
        let args = [op.to_vec(), arg(batch.id.0)];
        let out: Value = self
            .run_idempotent(&scripts::BATCH_READ, &batch.queue, &args)
            .await?;
        if matches!(out, Value::Int(-1)) {
            return Err(Error::not_found(batch.to_string()));
        }
        reply::items(out)
    }
}

/// A stage as the scripts reply it, `''` for none.
fn opt_stage(v: &Value) -> Result<Option<i32>> {
    reply::opt_text(v)?
        .map(|s| s.parse())
        .transpose()
        .map_err(Error::backend)
}

/// One entry of a job's attempt log, as the scripts write it.
#[derive(Deserialize)]
struct LogEntry {
    a: u32,
    w: String,
    s: String,
    e: String,
    o: String,
    x: Option<String>,
    out: Option<String>,
    /// The claim, where kept apart from the start `s`.
    #[serde(default)]
    c: Option<String>,
}

fn micros_of(t: &str) -> Result<i64> {
    t.parse().map_err(Error::backend)
}

#[async_trait]
impl Inspect for RedisBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"stats".to_vec()])
            .await?;
        let items = reply::items(out)?;
        if items.len() < 9 {
            return Err(bad("stats"));
        }
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            paused: text(&items[0])? == "1",
            max_running: reply::opt_text(&items[1])?
                .map(|m| m.parse())
                .transpose()
                .map_err(Error::backend)?,
            ..QueueStats::default()
        };
        let scheduled = u64::try_from(int(&items[2])?).map_err(Error::backend)?;
        stats.oldest_ready = reply::opt_text(&items[3])?
            .map(|t| micros_of(&t).map(reply::time))
            .transpose()?;
        let field = |i: usize| -> Result<Option<i64>> {
            reply::opt_text(&items[i])?
                .map(|t| micros_of(&t))
                .transpose()
        };
        if let Some(rate) = relayq_core::kit::rate::stored(field(4)?, field(5)?, field(6)?) {
            let now = field(8)?.ok_or_else(|| bad("stats"))?;
            stats.rate = Some(rate);
            stats.rate_next =
                relayq_core::kit::rate::next_start(&rate, field(7)?, now).map(reply::time);
        }
        for pair in items[9..].chunks(2) {
            let [state, n] = pair else {
                return Err(bad("stats"));
            };
            let n = u64::try_from(int(n)?).map_err(Error::backend)?;
            *stats.counts.entry(text(state)?.parse()?).or_default() += n;
        }
        if scheduled > 0 {
            let ready = stats.counts.entry(JobState::Ready).or_default();
            *ready = ready.saturating_sub(scheduled);
            if *ready == 0 {
                stats.counts.remove(&JobState::Ready);
            }
            stats.counts.insert(JobState::Scheduled, scheduled);
        }
        Ok(stats)
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"job".to_vec(), arg(id.0)])
            .await?;
        if matches!(out, Value::Int(-1)) {
            return Err(Error::not_found(format!("job {id} in queue {queue:?}")));
        }
        let items = reply::items(out)?;
        let (Some(now), Some(n)) = (items.first(), items.get(1)) else {
            return Err(bad("job"));
        };
        let now = reply::time(int(now)?);
        let split = usize::try_from(int(n)?).map_err(Error::backend)? + 2;
        if split > items.len() {
            return Err(bad("job"));
        }
        let mut h: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for pair in items[2..split].chunks(2) {
            let [k, v] = pair else { return Err(bad("job")) };
            h.insert(text(k)?, reply::bytes(v)?);
        }
        let field = |k: &str| -> Option<String> {
            h.get(k).map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let req = |k: &str| field(k).ok_or_else(|| bad(k));
        let mut log = items[split..]
            .iter()
            .map(|v| {
                let e: LogEntry = serde_json::from_str(&text(v)?).map_err(Error::backend)?;
                Ok(AttemptRecord {
                    attempt: e.a,
                    worker: e.w,
                    started_at: reply::time(micros_of(&e.s)?),
                    claimed_at: e.c.as_deref().map(micros_of).transpose()?.map(reply::time),
                    ended_at: Some(reply::time(micros_of(&e.e)?)),
                    outcome: e.o.parse()?,
                    error: e.x,
                    output: e.out,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut state: JobState = req("st")?.parse()?;
        let attempts: u32 = req("at")?.parse().map_err(Error::backend)?;
        let run_at = reply::time(micros_of(&req("ra")?)?);
        // The last attempt of a plainly completed job is kept in the hash (`lo` set),
        // not in the log list; see `complete_plain` in lib.lua.
        if let Some(outcome) = field("lo") {
            let (sa, fa) = (micros_of(&req("sa")?)?, micros_of(&req("fa")?)?);
            // Its wait in the worker before the handler started (SPEC L5).
            let wt = field("wt").and_then(|w| w.parse::<i64>().ok()).unwrap_or(0);
            log.push(AttemptRecord {
                attempt: attempts,
                worker: field("w").unwrap_or_default(),
                started_at: reply::time(sa.saturating_add(wt).min(fa)),
                claimed_at: Some(reply::time(sa)),
                ended_at: Some(reply::time(fa)),
                outcome: outcome.parse()?,
                error: None,
                output: field("out"),
            });
        }
        if state == JobState::Running {
            log.push(AttemptRecord {
                attempt: attempts,
                worker: field("w").unwrap_or_default(),
                started_at: reply::time(micros_of(&req("sa")?)?),
                claimed_at: Some(reply::time(micros_of(&req("sa")?)?)),
                ended_at: None,
                outcome: AttemptOutcome::Running,
                error: None,
                output: None,
            });
        }
        if state == JobState::Ready && run_at > now {
            state = JobState::Scheduled;
        }
        let parse_i = |k: &str| -> Result<Option<i64>> {
            field(k)
                .map(|v| v.parse().map_err(Error::backend))
                .transpose()
        };
        let mut after = field("aft")
            .unwrap_or_default()
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().map(JobId).map_err(Error::backend))
            .collect::<Result<Vec<_>>>()?;
        after.sort_unstable();
        Ok(JobInfo {
            after,
            id,
            queue: queue.to_owned(),
            state,
            payload: h.get("p").cloned().unwrap_or_default(),
            priority: req("pr")?.parse().map_err(Error::backend)?,
            run_at,
            attempts,
            max_attempts: req("ma")?.parse().map_err(Error::backend)?,
            group: field("g"),
            batch: parse_i("b")?.map(BatchId),
            stage: parse_i("s")?
                .map(i32::try_from)
                .transpose()
                .map_err(Error::backend)?,
            dedupe_key: field("dk"),
            enqueued_by: field("by"),
            created_at: reply::time(micros_of(&req("ca")?)?),
            finished_at: parse_i("fa")?.map(reply::time),
            last_error: field("le"),
            attempt_log: log,
            progress: field("pg").as_deref().and_then(Progress::from_stored),
            limit_key: field("lk"),
        })
    }

    async fn key_limits_unchecked(&self, queue: &str) -> Result<KeyLimits> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"keys".to_vec(), arg(KEYS_LISTED)])
            .await?;
        let items = reply::items(out)?;
        let [default, default_rate, keys @ ..] = &items[..] else {
            return Err(bad("keys"));
        };
        let some_text = |v: &Value| -> Result<Option<String>> {
            Ok(reply::opt_text(v)?.filter(|t| !t.is_empty()))
        };
        let parse = |v: &Value| -> Result<Option<u32>> {
            some_text(v)?
                .map(|t| t.parse().map_err(Error::backend))
                .transpose()
        };
        let rate = |v: &Value| -> Result<Option<relayq_core::Rate>> {
            let Some(t) = some_text(v)? else {
                return Ok(None);
            };
            let mut n = t.split(',').map(str::parse::<i64>);
            let mut next = || n.next().transpose().map_err(Error::backend);
            Ok(relayq_core::kit::rate::stored(next()?, next()?, next()?))
        };
        let default = parse(default)?;
        let default_rate = rate(default_rate)?;
        let keys = keys
            .chunks(5)
            .map(|f| {
                let [key, running, own, own_rate, next] = f else {
                    return Err(bad("keys"));
                };
                let own = parse(own)?;
                let own_rate = rate(own_rate)?;
                let rate_next = some_text(next)?
                    .map(|t| t.parse::<i64>().map(reply::time))
                    .transpose()
                    .map_err(Error::backend)?;
                Ok(KeyUse {
                    key: text(key)?,
                    running: u64::try_from(int(running)?.max(0)).map_err(Error::backend)?,
                    own,
                    limit: own.or(default),
                    own_rate,
                    rate: own_rate.or(default_rate),
                    rate_next,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KeyLimits {
            default,
            default_rate,
            keys,
        })
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"running".to_vec()])
            .await?;
        let mut jobs = reply::items(out)?
            .chunks(6)
            .map(|f| {
                let [id, worker, attempt, started, expires, progress] = f else {
                    return Err(bad("running"));
                };
                let progress = match progress {
                    Value::Nil => None,
                    v => Progress::from_stored(&text(v)?),
                };
                Ok(RunningJob {
                    id: JobId(int(id)?),
                    worker: text(worker)?,
                    attempt: u32::try_from(int(attempt)?).map_err(Error::backend)?,
                    started_at: reply::time(int(started)?),
                    lease_expires_at: reply::time(int(expires)?),
                    progress,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        jobs.sort_unstable_by_key(|j| j.id);
        Ok(jobs)
    }

    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        let args = [b"holder".to_vec(), group.as_bytes().to_vec()];
        let id: i64 = self.run_idempotent(&scripts::READ, queue, &args).await?;
        Ok((id > 0).then_some(JobId(id)))
    }

    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"batches".to_vec(), arg(limit)])
            .await?;
        let ids = reply::items(out)?
            .iter()
            .map(int)
            .collect::<Result<Vec<_>>>()?;
        relayq_core::listing::batches(self, queue, ids).await
    }

    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        // The batch's ids are a set: the script only reads it (SMEMBERS), and the
        // sorting and paging happen here, so a big batch costs Redis one read of the
        // set per page rather than a sort in Lua as well.
        let out: Value = self
            .run_idempotent(
                &scripts::READ,
                &batch.queue,
                &[b"batch_jobs".to_vec(), arg(batch.id.0)],
            )
            .await?;
        if matches!(out, Value::Int(-1)) {
            return Err(Error::not_found(batch.to_string()));
        }
        let after = after.map_or(i64::MIN, |a| a.0);
        let mut ids = reply::items(out)?
            .iter()
            .map(int)
            .collect::<Result<Vec<i64>>>()?;
        ids.retain(|&id| id > after);
        ids.sort_unstable();
        ids.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(ids.into_iter().map(JobId).collect())
    }

    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<relayq_core::WorkerSeen>> {
        let kept = micros(relayq_core::workers::BEAT_KEPT);
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"workers".to_vec(), arg(kept)])
            .await?;
        let mut seen = Vec::new();
        for pair in reply::items(out)?.chunks(2) {
            let [beat, at] = pair else {
                return Err(bad("workers"));
            };
            if let Some(beat) = relayq_core::WorkerBeat::from_stored(&text(beat)?) {
                seen.push(relayq_core::WorkerSeen {
                    beat,
                    last_seen: reply::time(int(at)?),
                });
            }
        }
        Ok(seen)
    }

    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<JobPage> {
        let opt = |v: Option<String>| v.unwrap_or_default().into_bytes();
        let out: Value = self
            .run_idempotent(
                &scripts::READ,
                queue,
                &[
                    b"list".to_vec(),
                    opt(before.map(|b| b.0.to_string())),
                    arg(limit),
                    arg(LIST_SCAN_REDIS),
                    opt(filter.state.map(|s| s.as_str().to_owned())),
                    opt(filter.batch.map(|b| b.0.to_string())),
                    opt(filter.stage.map(|s| s.to_string())),
                    opt(filter.group.clone()),
                    opt(filter.text.clone()),
                ],
            )
            .await?;
        let items = reply::items(out)?;
        let Some((next, ids)) = items.split_first() else {
            return Err(bad("list"));
        };
        let next = match reply::bytes(next)?.as_slice() {
            b"" => None,
            _ => Some(JobId(int(next)?)),
        };
        let jobs = ids
            .iter()
            .map(|v| int(v).map(JobId))
            .collect::<Result<_>>()?;
        Ok(JobPage { jobs, next })
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        let out: Value = self
            .run_idempotent(&scripts::READ, queue, &[b"dead".to_vec(), arg(limit)])
            .await?;
        let ids = reply::items(out)?
            .iter()
            .map(int)
            .collect::<Result<Vec<_>>>()?;
        relayq_core::listing::jobs(self, queue, ids).await
    }

    async fn queues(&self) -> Result<Vec<String>> {
        self.registered().await
    }
}

/// How many ids one listing call looks at on Redis: a script blocks the server while
/// it runs, so the scan is cut shorter than [`relayq_core::LIST_SCAN`] (about 2 ms).
const LIST_SCAN_REDIS: u32 = 2_000;

impl RedisBackend {
    /// SPEC M9: stores `beat` with the server's time; drops the queue's old beats.
    pub(crate) async fn beat(&self, queue: &str, beat: &relayq_core::WorkerBeat) -> Result<()> {
        let kept = micros(relayq_core::workers::BEAT_KEPT);
        let args = [
            b"beat".to_vec(),
            beat.worker.clone().into_bytes(),
            beat.to_stored().into_bytes(),
            arg(kept),
        ];
        self.admin(queue, &args).await?;
        Ok(())
    }

    async fn admin(&self, queue: &str, args: &[Vec<u8>]) -> Result<Value> {
        self.run(&scripts::ADMIN, queue, args).await
    }
}

#[async_trait]
impl Admin for RedisBackend {
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        // A resume alone stores nothing new, so it does not list the queue as in use.
        if update.paused == Some(true) || update.max_running.is_some() || update.rate.is_some() {
            self.register(queue).await?;
        }
        if let Some(rate) = update.rate {
            let args = match rate {
                Some(r) => [
                    b"rate".to_vec(),
                    arg(r.count),
                    arg(micros(r.per)),
                    arg(r.burst),
                ],
                None => [b"rate".to_vec(), Vec::new(), Vec::new(), Vec::new()],
            };
            self.admin(queue, &args).await?;
        }
        if let Some(paused) = update.paused {
            let op: &[u8] = if paused { b"pause" } else { b"resume" };
            self.admin(queue, &[op.to_vec()]).await?;
        }
        if let Some(max) = update.max_running {
            let max = max.map(arg).unwrap_or_default();
            self.admin(queue, &[b"max".to_vec(), max]).await?;
        }
        if update.may_free_claims() {
            self.notify_local(queue, EventKind::Ready);
        }
        Ok(())
    }

    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        self.register(queue).await?;
        let args = [
            b"keylimit".to_vec(),
            key.map(|k| format!("k{k}"))
                .unwrap_or_default()
                .into_bytes(),
            limit.map(arg).unwrap_or_default(),
        ];
        self.admin(queue, &args).await?;
        self.notify_local(queue, EventKind::Ready);
        Ok(())
    }

    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<relayq_core::Rate>,
    ) -> Result<()> {
        self.register(queue).await?;
        let key = key
            .map(|k| format!("k{k}"))
            .unwrap_or_default()
            .into_bytes();
        let args = match rate {
            Some(r) => [
                b"keyrate".to_vec(),
                key,
                arg(r.count),
                arg(micros(r.per)),
                arg(r.burst),
            ],
            None => [b"keyrate".to_vec(), key, Vec::new(), Vec::new(), Vec::new()],
        };
        self.admin(queue, &args).await?;
        self.notify_local(queue, EventKind::Ready);
        Ok(())
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        let args = [
            b"job".to_vec(),
            arg(id.0),
            cancelled_by::JOB.as_bytes().to_vec(),
        ];
        let n: i64 = self.run(&scripts::CANCEL, queue, &args).await?;
        if n < 0 {
            return Err(Error::not_found(format!("job {id} in queue {queue:?}")));
        }
        if n > 0 {
            self.notify_local(queue, EventKind::Revoked);
            self.notify_local(queue, EventKind::Finished);
            self.notify_local(queue, EventKind::Ready);
        }
        Ok(n > 0)
    }

    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        let args = [
            b"batch".to_vec(),
            arg(batch.id.0),
            cancelled_by::BATCH.as_bytes().to_vec(),
        ];
        let n: i64 = self.run(&scripts::CANCEL, &batch.queue, &args).await?;
        if n < 0 {
            return Err(Error::not_found(batch.to_string()));
        }
        if n > 0 {
            self.notify_local(&batch.queue, EventKind::Revoked);
        }
        self.notify_local(&batch.queue, EventKind::Finished);
        self.notify_local(&batch.queue, EventKind::Ready);
        u64::try_from(n).map_err(Error::backend)
    }

    /// In steps of one script each, so no script holds the server for long: the
    /// batches 20 at a time, up to the newest when it starts, then the other jobs 200
    /// at a time. Without an index of a queue's unfinished jobs by id, a steady stream
    /// of enqueues could keep the second part going: it stops after as many steps as
    /// the jobs unfinished at the start take.
    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let why = cancelled_by::PURGE.as_bytes().to_vec();
        let mut n = 0u64;
        let mut after = 0i64;
        // The newest batch when the purge starts, set by the first step.
        let mut upto = Vec::new();
        loop {
            let args = [b"purge_batches".to_vec(), arg(after), why.clone(), upto];
            let (last, cancelled, newest): (i64, i64, i64) =
                self.run(&scripts::CANCEL, queue, &args).await?;
            n += u64::try_from(cancelled).map_err(Error::backend)?;
            if last == 0 {
                break;
            }
            after = last;
            upto = arg(newest);
        }
        let stats = self.queue_stats_unchecked(queue).await?;
        let unfinished: u64 = JobState::ALL
            .iter()
            .filter(|s| !s.is_finished())
            .map(|s| stats.count(*s))
            .sum();
        for _ in 0..=unfinished / 200 + 1 {
            let args = [b"purge_jobs".to_vec(), arg(0), why.clone()];
            let cancelled: i64 = self.run(&scripts::CANCEL, queue, &args).await?;
            if cancelled == 0 {
                break;
            }
            n += u64::try_from(cancelled).map_err(Error::backend)?;
        }
        if n > 0 {
            self.notify_local(queue, EventKind::Revoked);
            self.notify_local(queue, EventKind::Finished);
        }
        Ok(n)
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let mut args = vec![b"runnow".to_vec()];
        args.extend(ids.iter().map(|id| arg(id.0)));
        let out = self.admin(queue, &args).await?;
        u64::try_from(int(&out)?).map_err(Error::backend)
    }

    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let mut args = vec![b"delete".to_vec()];
        args.extend(ids.iter().map(|id| arg(id.0)));
        let out = self.admin(queue, &args).await?;
        u64::try_from(int(&out)?).map_err(Error::backend)
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let list = ids
            .map(|ids| {
                ids.iter()
                    .map(|id| id.0.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        if ids.is_some_and(<[JobId]>::is_empty) {
            return Ok(0);
        }
        let out = self
            .admin(queue, &[b"retry".to_vec(), list.into_bytes()])
            .await?;
        self.notify_local(queue, EventKind::Ready);
        u64::try_from(int(&out)?).map_err(Error::backend)
    }

    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        // Beyond a century, keep everything.
        let retention = micros(retention.min(Duration::from_secs(100 * 365 * 86_400)));
        let mut m = Maintenance::default();
        loop {
            let out = self
                .admin(queue, &[b"maintain".to_vec(), arg(retention)])
                .await?;
            let items = reply::items(out)?;
            let [requeued, dead, pruned, more] = items.as_slice() else {
                return Err(bad("maintain"));
            };
            let count = |v: &Value| u64::try_from(int(v)?).map_err(Error::backend);
            m.requeued += count(requeued)?;
            m.dead += count(dead)?;
            m.pruned += count(pruned)?;
            if int(more)? == 0 {
                break;
            }
        }
        if m.requeued + m.dead > 0 {
            self.notify_local(queue, EventKind::Finished);
            self.notify_local(queue, EventKind::Ready);
        }
        Ok(m)
    }

    async fn try_maintain_unchecked(
        &self,
        queue: &str,
        retention: Duration,
    ) -> Result<Option<Maintenance>> {
        self.maintain_locked(queue, retention).await
    }
}
