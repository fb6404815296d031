//! SPEC E, C, L: enqueue, claim and settle, one script call each.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::Value;
use relayq_core::{
    BatchId, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Enqueued, Error, EventKind, JobId,
    Lease, LeaseToken, Limits, NewJob, Outcome, ProgressReport, Result, Retry, RunAt, Settle,
    Settled,
};

use crate::{
    RedisBackend, arg, micros,
    reply::{self, bad, int, text},
    scripts,
};

/// Appends `job`'s 11 fields in the order `enqueue_jobs` (lib.lua) reads them.
pub(crate) fn push_job(args: &mut Vec<Vec<u8>>, job: &NewJob) {
    // Relative times resolve against the server's clock, in the script.
    let (at, delay) = match job.run_at {
        RunAt::Now => (String::new(), "0".to_owned()),
        RunAt::After(d) => (String::new(), micros(d).to_string()),
        RunAt::At(t) => (t.timestamp_micros().to_string(), String::new()),
    };
    args.push(job.payload.clone());
    args.push(arg(job.priority));
    args.push(at.into_bytes());
    args.push(delay.into_bytes());
    args.push(arg(job.max_attempts));
    args.push(job.group.clone().unwrap_or_default().into_bytes());
    args.push(
        job.batch
            .map(|b| b.0.to_string())
            .unwrap_or_default()
            .into_bytes(),
    );
    args.push(arg(job.stage.unwrap_or(0)));
    args.push(job.dedupe_key.clone().unwrap_or_default().into_bytes());
    args.push(job.enqueued_by.clone().unwrap_or_default().into_bytes());
    args.push(job.limit_key.clone().unwrap_or_default().into_bytes());
}

/// The jobs that run after others (SPEC D), after the jobs' fields, as `enqueue_jobs`
/// in lib.lua reads them: their count, then per job its index, its policy ('' for its
/// batch's), its count of parents, and each parent as `j<id>` (stored) or `c<index>`
/// (of the call).
pub(crate) fn push_after(args: &mut Vec<Vec<u8>>, jobs: &[NewJob]) {
    let with: Vec<(usize, &NewJob)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| !j.after.is_empty())
        .collect();
    if with.is_empty() {
        return;
    }
    args.push(arg(with.len()));
    for (i, job) in with {
        args.push(arg(i));
        args.push(
            job.after_failure
                .map(|p| p.as_str().as_bytes().to_vec())
                .unwrap_or_default(),
        );
        args.push(arg(job.after.len()));
        for a in &job.after {
            args.push(match a {
                relayq_core::After::Job(id) => format!("j{id}").into_bytes(),
                relayq_core::After::Call(p) => format!("c{p}").into_bytes(),
            });
        }
    }
}

/// Fields per claimed job in the claim script's reply.
const CLAIMED_FIELDS: usize = 5;

#[async_trait]
impl Enqueue for RedisBackend {
    fn limits(&self) -> Limits {
        // Limit keys are enforced here (SPEC K), whatever the configuration says.
        Limits {
            limit_keys: true,
            rates: true,
            dependencies: true,
            ..self.inner.limits
        }
    }

    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let Some(queue) = jobs.first().map(|j| j.queue.clone()) else {
            return Ok(Vec::new());
        };
        self.register(&queue).await?;
        let mut args = Vec::with_capacity(1 + jobs.len() * 11);
        args.push(arg(jobs.len()));
        for job in &jobs {
            push_job(&mut args, job);
        }
        push_after(&mut args, &jobs);
        let out: Value = self.run(&scripts::ENQUEUE, &queue, &args).await?;
        let items = reply::items(out)?;
        let out = items
            .chunks(2)
            .map(|pair| {
                Ok(Enqueued {
                    id: JobId(int(&pair[0])?),
                    deduplicated: int(pair.get(1).ok_or_else(|| bad("enqueue"))?)? == 1,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.notify_local(&queue, EventKind::Ready);
        Ok(out)
    }
}

#[async_trait]
impl Claim for RedisBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<relayq_core::Claimed> {
        let tokens: Vec<LeaseToken> = (0..req.limit).map(|_| LeaseToken::random()).collect();
        let mut args = vec![
            arg(req.limit),
            arg(micros(req.lease)),
            req.worker.clone().into_bytes(),
        ];
        args.extend(tokens.iter().map(|t| t.0.to_string().into_bytes()));
        // After the tokens: how many of the jobs start at once (SPEC K6).
        args.push(arg(req.slots.min(req.limit)));
        let out: Value = self.run(&scripts::CLAIM, &req.queue, &args).await?;
        let items = reply::items(out)?;
        let [expiry, wait, wake, jobs @ ..] = &items[..] else {
            return Err(bad("claim"));
        };
        let micros_of = |v: &Value| -> Result<Option<Duration>> {
            reply::opt_text(v)?
                .filter(|w| !w.is_empty())
                .map(|w| w.parse::<u64>().map(Duration::from_micros))
                .transpose()
                .map_err(Error::backend)
        };
        let (next_in, wake_in) = (micros_of(wait)?, micros_of(wake)?);
        if jobs.is_empty() {
            return Ok(relayq_core::Claimed::new(Vec::new(), next_in).waking_in(wake_in));
        }
        let expires_at = reply::time(int(expiry)?);
        // The k-th job claimed holds the k-th token, as the script hands them out.
        let jobs = jobs
            .chunks(CLAIMED_FIELDS)
            .zip(tokens)
            .map(|(f, token)| {
                if f.len() != CLAIMED_FIELDS {
                    return Err(bad("claim"));
                }
                let fixed = reply::bytes(&f[4])?;
                let mut fixed = fixed.split(|&b| b == 0).map(std::str::from_utf8);
                let mut next = || -> Result<Option<&str>> {
                    let v = fixed.next().ok_or_else(|| bad("claim"))?;
                    Ok(Some(v.map_err(Error::backend)?).filter(|v| !v.is_empty()))
                };
                let (priority, max_attempts) = (next()?, next()?);
                let (group, batch, stage, enqueued_by) = (next()?, next()?, next()?, next()?);
                let number = |v: Option<&str>| -> Result<i64> {
                    v.ok_or_else(|| bad("claim"))?
                        .parse()
                        .map_err(Error::backend)
                };
                Ok(ClaimedJob {
                    lease: Lease {
                        queue: req.queue.clone(),
                        job: JobId(int(&f[0])?),
                        token,
                        attempt: u32::try_from(int(&f[1])?).map_err(Error::backend)?,
                        expires_at,
                        worker: req.worker.clone(),
                    },
                    payload: reply::bytes(&f[2])?,
                    priority: i16::try_from(number(priority)?).map_err(Error::backend)?,
                    run_at: reply::time(int(&f[3])?),
                    max_attempts: u16::try_from(number(max_attempts)?).map_err(Error::backend)?,
                    group: group.map(str::to_owned),
                    batch: batch.map(|b| number(Some(b)).map(BatchId)).transpose()?,
                    stage: stage.map(str::parse).transpose().map_err(Error::backend)?,
                    enqueued_by: enqueued_by.map(str::to_owned),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(relayq_core::Claimed::new(jobs, next_in).waking_in(wake_in))
    }
}

// Keeps the default `preferred_settle_batch` (128): a call costs little beyond its
// leases here, and bigger ones measured slower (a script holds the server while the
// claims queued behind it wait: calls of 512 drained about 15% slower).
#[async_trait]
impl Complete for RedisBackend {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        // One script per queue: a script stays in one slot.
        let mut out: Vec<Option<Result<Settled>>> = settles.iter().map(|_| None).collect();
        let mut queues: Vec<&str> = settles.iter().map(|s| s.lease.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        let mut applied = false;
        for queue in queues {
            let mine: Vec<usize> = (0..settles.len())
                .filter(|&i| settles[i].lease.queue == queue)
                .collect();
            let mut args = vec![arg(mine.len())];
            for &i in &mine {
                push_settle(&mut args, &settles[i]);
            }
            // A queue's script failing does not undo another queue's: once one was
            // applied, a later failure goes to its own leases only, so the caller sees
            // which were settled. Before that, the whole call failed and can be retried.
            let verdicts = match self.run::<Value>(&scripts::SETTLE, queue, &args).await {
                Ok(reply) => reply::items(reply)?,
                Err(e) if !applied => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    for &i in &mine {
                        out[i] = Some(Err(Error::backend(text.clone())));
                    }
                    continue;
                }
            };
            if verdicts.len() != mine.len() {
                return Err(bad("settle"));
            }
            for (&i, v) in mine.iter().zip(&verdicts) {
                out[i] = Some(verdict(&text(v)?));
            }
            applied = true;
            self.notify_local(queue, EventKind::Finished);
            self.notify_local(queue, EventKind::Ready);
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| bad("settle")))
            .collect()
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        let args = [
            arg(lease.job.0),
            lease.token.0.to_string().into_bytes(),
            arg(micros(extend)),
        ];
        // Extending twice to now + extend is the same as once.
        let until: i64 = self
            .run_idempotent(&scripts::HEARTBEAT, &lease.queue, &args)
            .await?;
        if until < 0 {
            return Err(Error::StaleLease);
        }
        Ok(reply::time(until))
    }

    /// One read script per queue: a queue's keys share a hash slot, queues need not.
    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let mut by_queue: std::collections::BTreeMap<&str, Vec<Vec<u8>>> = Default::default();
        for l in leases {
            let args = by_queue
                .entry(&l.queue)
                .or_insert_with(|| vec![b"lost".to_vec()]);
            args.extend([arg(l.job.0), l.token.0.to_string().into_bytes()]);
        }
        let mut lost = Vec::new();
        for (queue, args) in by_queue {
            let ids: Vec<i64> = self.run_idempotent(&scripts::READ, queue, &args).await?;
            lost.extend(ids.into_iter().map(JobId));
        }
        lost.sort_unstable();
        lost.dedup();
        Ok(lost)
    }

    /// One script per queue, as [`lost_leases`](Self::lost_leases_unchecked); storing
    /// the same progress twice is harmless, so it is tried again after a lost connection.
    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.beat(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let mut by_queue: std::collections::BTreeMap<&str, Vec<Vec<u8>>> = Default::default();
        for r in reports {
            by_queue.entry(&r.lease.queue).or_default().extend([
                arg(r.lease.job.0),
                r.lease.token.0.to_string().into_bytes(),
                r.stored().into_bytes(),
            ]);
        }
        let mut lost = Vec::new();
        for (queue, args) in by_queue {
            let ids: Vec<i64> = self
                .run_idempotent(&scripts::PROGRESS, queue, &args)
                .await?;
            lost.extend(ids.into_iter().map(JobId));
        }
        Ok(lost)
    }
}

/// One lease's record for the settle script: a completion without output in three
/// arguments (`c`, id, token), or four with the wait before its handler started (`w`,
/// id, token, microseconds), anything else in nine (`x`, id, token, kind, retry delay,
/// retry time, error, output, wait or '').
fn push_settle(args: &mut Vec<Vec<u8>>, s: &Settle) {
    let id = arg(s.lease.job.0);
    let token = s.lease.token.0.to_string().into_bytes();
    // A wait under a millisecond is not worth a field: the log keeps the claim time.
    let waited = Some(s.waited_micros()).filter(|&w| w >= 1000);
    if matches!(s.outcome, Outcome::Complete) && s.output.is_none() {
        match waited {
            None => args.extend([b"c".to_vec(), id, token]),
            Some(w) => args.extend([b"w".to_vec(), id, token, arg(w)]),
        }
        return;
    }
    let (kind, delay, at, error) = match &s.outcome {
        Outcome::Complete => ("complete", String::new(), String::new(), ""),
        Outcome::Release => ("release", String::new(), String::new(), ""),
        Outcome::Fail { error, retry } => {
            let (delay, at) = match *retry {
                Retry::At(t) => (String::new(), t.timestamp_micros().to_string()),
                Retry::Never => (String::new(), String::new()),
                r => (
                    r.delay(s.lease.attempt, Utc::now())
                        .map(|d| micros(d).to_string())
                        .unwrap_or_default(),
                    String::new(),
                ),
            };
            ("fail", delay, at, error.as_str())
        }
    };
    args.extend([b"x".to_vec(), id, token, kind.as_bytes().to_vec()]);
    args.push(delay.into_bytes());
    args.push(at.into_bytes());
    args.push(error.as_bytes().to_vec());
    args.push(
        s.output
            .as_ref()
            .map(|o| format!("={o}").into_bytes())
            .unwrap_or_default(),
    );
    args.push(waited.map(arg).unwrap_or_default());
}

fn verdict(v: &str) -> Result<Settled> {
    match v {
        "c" => Ok(Settled::Completed),
        "r" => Ok(Settled::Released),
        "d" => Ok(Settled::Dead),
        "s" => Err(Error::StaleLease),
        t if t.starts_with('t') => {
            let at: i64 = t[1..].parse().map_err(Error::backend)?;
            Ok(Settled::Retrying {
                at: reply::time(at),
            })
        }
        _ => Err(bad("settle verdict")),
    }
}
