//! Helpers shared by the cases: short claims, error checks, the one-job-per-state
//! fixture and the concurrent claim-loop workers of the load scenarios.

use std::{
    collections::HashMap,
    fmt::Debug,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use chrono::{DateTime, TimeDelta, Utc};
use relayq_core::{
    Backend, ClaimRequest, ClaimedJob, CompleteExt, Error, JobId, JobState, NewJob, Retry, Settled,
};
use tokio::time::{Instant, sleep};

use crate::{Env, poll_until};

/// The lease of claims that are not about expiry: long enough never to run out.
pub const LEASE: Duration = Duration::from_secs(30);
/// The lease of expiry cases: short, so they finish quickly.
pub const SHORT_LEASE: Duration = Duration::from_millis(300);
/// How long a poll waits for something that should happen within a second.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// Rounding a server may apply to stored timestamps (e.g. to microseconds or 100 ns).
pub const TIME_SLACK: TimeDelta = TimeDelta::milliseconds(10);

/// A `TimeDelta` from a std `Duration` (all durations here are small).
#[must_use]
pub fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// Enqueues `n` plain jobs (payload = their index) into `queue`; returns their ids.
///
/// # Errors
/// When enqueue fails or does not return `n` fresh ids.
pub async fn enqueue_n(b: &dyn Backend, queue: &str, n: usize) -> anyhow::Result<Vec<JobId>> {
    let jobs = (0..n)
        .map(|i| NewJob::new(queue, i.to_string().into_bytes()))
        .collect();
    enqueue_all(b, jobs).await
}

/// Enqueues `jobs` in one call; checks one fresh id comes back per job.
///
/// # Errors
/// When enqueue fails, deduplicates, or returns the wrong number of ids.
pub async fn enqueue_all(b: &dyn Backend, jobs: Vec<NewJob>) -> anyhow::Result<Vec<JobId>> {
    let n = jobs.len();
    let out = b.enqueue(jobs).await?;
    ensure!(
        out.len() == n,
        "enqueue of {n} jobs returned {} ids",
        out.len()
    );
    ensure!(
        out.iter().all(|e| !e.deduplicated),
        "no job had a dedupe key, yet some came back deduplicated: {out:?}"
    );
    Ok(out.into_iter().map(|e| e.id).collect())
}

/// Enqueues one job; returns its fresh id.
///
/// # Errors
/// When enqueue fails or deduplicates.
pub async fn enqueue(b: &dyn Backend, job: NewJob) -> anyhow::Result<JobId> {
    Ok(enqueue_all(b, vec![job]).await?[0])
}

/// Claims up to `limit` jobs of `queue` as worker `w` with [`LEASE`].
///
/// # Errors
/// When the claim fails.
pub async fn claim(b: &dyn Backend, queue: &str, limit: u32) -> anyhow::Result<Vec<ClaimedJob>> {
    claim_as(b, queue, "w", limit, LEASE).await
}

/// Claims up to `limit` jobs of `queue` as `worker`, leased for `lease`.
///
/// # Errors
/// When the claim fails.
pub async fn claim_as(
    b: &dyn Backend,
    queue: &str,
    worker: &str,
    limit: u32,
    lease: Duration,
) -> anyhow::Result<Vec<ClaimedJob>> {
    Ok(b.claim(ClaimRequest::new(queue, worker, limit, lease))
        .await?)
}

/// Claims with a limit above `want.len()` and checks that exactly `want` came back, in
/// that order.
///
/// # Errors
/// When anything else (or nothing) comes back.
pub async fn claim_exactly(
    b: &dyn Backend,
    queue: &str,
    want: &[JobId],
) -> anyhow::Result<Vec<ClaimedJob>> {
    let limit = u32::try_from(want.len() + 5).unwrap_or(1000);
    let got = claim(b, queue, limit).await?;
    ensure!(
        ids(&got) == want,
        "expected the claim to return {want:?}, got {:?}",
        ids(&got)
    );
    Ok(got)
}

/// Checks that a claim returns nothing now.
///
/// # Errors
/// When a job comes back.
pub async fn claim_nothing(b: &dyn Backend, queue: &str, why: &str) -> anyhow::Result<()> {
    let got = claim(b, queue, 10).await?;
    ensure!(
        got.is_empty(),
        "expected no claimable job ({why}), got {:?}",
        ids(&got)
    );
    Ok(())
}

/// Polls claims (limit `limit`, lease `lease`, worker `worker`) until one returns jobs.
///
/// # Errors
/// When nothing comes back within [`PATIENCE`].
pub async fn poll_claim(
    b: &dyn Backend,
    queue: &str,
    worker: &str,
    limit: u32,
    lease: Duration,
    what: &str,
) -> anyhow::Result<Vec<ClaimedJob>> {
    poll_until(what, PATIENCE, || async {
        let got = claim_as(b, queue, worker, limit, lease).await?;
        Ok((!got.is_empty()).then_some(got))
    })
    .await
}

/// The ids of claimed jobs, in result order.
#[must_use]
pub fn ids(jobs: &[ClaimedJob]) -> Vec<JobId> {
    jobs.iter().map(ClaimedJob::id).collect()
}

/// The server time of the claim that produced `job`, derived from its lease expiry.
#[must_use]
pub fn claimed_at(job: &ClaimedJob, lease: Duration) -> DateTime<Utc> {
    job.lease.expires_at - delta(lease)
}

/// The state of job `id` of `queue`, by [`Inspect::job`](relayq_core::Inspect::job).
///
/// # Errors
/// When the job cannot be read.
pub async fn state(b: &dyn Backend, queue: &str, id: JobId) -> anyhow::Result<JobState> {
    Ok(b.job(queue, id)
        .await
        .with_context(|| format!("reading job {id}"))?
        .state)
}

/// Checks the state of job `id`.
///
/// # Errors
/// When it is not `want`.
pub async fn expect_state(
    b: &dyn Backend,
    queue: &str,
    id: JobId,
    want: JobState,
) -> anyhow::Result<()> {
    let got = state(b, queue, id).await?;
    ensure!(got == want, "expected job {id} to be {want}, it is {got}");
    Ok(())
}

/// The number of jobs stored in `queue`, in any state.
///
/// # Errors
/// When the stats cannot be read.
pub async fn total(b: &dyn Backend, queue: &str) -> anyhow::Result<u64> {
    Ok(b.queue_stats(queue).await?.total())
}

/// The number of unfinished jobs of `queue`.
///
/// # Errors
/// When the stats cannot be read.
pub async fn unfinished(b: &dyn Backend, queue: &str) -> anyhow::Result<u64> {
    let stats = b.queue_stats(queue).await?;
    Ok(JobState::ALL
        .iter()
        .filter(|s| !s.is_finished())
        .map(|s| stats.count(*s))
        .sum())
}

/// Checks that `res` is [`Error::InvalidInput`] on `field`.
///
/// # Errors
/// When it is anything else.
pub fn expect_invalid<T: Debug>(
    res: relayq_core::Result<T>,
    field: &str,
    what: &str,
) -> anyhow::Result<()> {
    match res {
        Err(e) if e.invalid_field() == Some(field) => Ok(()),
        other => bail!("{what}: expected InvalidInput on {field:?}, got {other:?}"),
    }
}

/// Checks that `res` is [`Error::StaleLease`].
///
/// # Errors
/// When it is anything else.
pub fn expect_stale<T: Debug>(res: relayq_core::Result<T>, what: &str) -> anyhow::Result<()> {
    match res {
        Err(e) if e.is_stale_lease() => Ok(()),
        other => bail!("{what}: expected StaleLease, got {other:?}"),
    }
}

/// Checks that `res` is [`Error::NotFound`].
///
/// # Errors
/// When it is anything else.
pub fn expect_not_found<T: Debug>(res: relayq_core::Result<T>, what: &str) -> anyhow::Result<()> {
    match res {
        Err(Error::NotFound { .. }) => Ok(()),
        other => bail!("{what}: expected NotFound, got {other:?}"),
    }
}

/// Puts one job of `queue` into each of the eight states and returns them by state:
/// running, retrying (for an hour), succeeded, dead, cancelled, scheduled (an hour
/// ahead), ready (head of group `g`) and blocked (behind it in group `g`).
///
/// # Errors
/// When any step does not do what the SPEC says.
pub async fn one_job_per_state(
    b: &dyn Backend,
    queue: &str,
) -> anyhow::Result<HashMap<JobState, JobId>> {
    let hour = Duration::from_secs(3600);
    let first = enqueue_n(b, queue, 4).await?;
    let claimed = claim_exactly(b, queue, &first).await?;
    let [running, retrying, succeeded, dead] = claimed.as_slice() else {
        bail!("expected 4 claimed jobs");
    };
    b.complete(&succeeded.lease).await?;
    let r = b.fail(&dead.lease, "fatal", Retry::Never).await?;
    ensure!(
        r == Settled::Dead,
        "fail with Retry::Never gave {r:?}, expected Dead"
    );
    let r = b.fail(&retrying.lease, "later", Retry::After(hour)).await?;
    ensure!(
        matches!(r, Settled::Retrying { .. }),
        "fail with attempts left gave {r:?}, expected Retrying"
    );
    let cancelled = enqueue(b, NewJob::new(queue, b"c".to_vec())).await?;
    ensure!(
        b.cancel_job(queue, cancelled).await?,
        "cancel of a ready job returned false"
    );
    let rest = enqueue_all(
        b,
        vec![
            NewJob::new(queue, b"s".to_vec()).delay(hour),
            NewJob::new(queue, b"r".to_vec()).group("g"),
            NewJob::new(queue, b"k".to_vec()).group("g"),
        ],
    )
    .await?;
    Ok(HashMap::from([
        (JobState::Running, running.id()),
        (JobState::Retrying, retrying.id()),
        (JobState::Succeeded, succeeded.id()),
        (JobState::Dead, dead.id()),
        (JobState::Cancelled, cancelled),
        (JobState::Scheduled, rest[0]),
        (JobState::Ready, rest[1]),
        (JobState::Blocked, rest[2]),
    ]))
}

/// How the claim-loop workers of [`drain`] behave.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// How many workers, each on its own handle from [`Env::connect`].
    pub workers: usize,
    /// The `limit` of each claim; a worker runs the jobs of one claim concurrently.
    pub limit: u32,
    /// Each job's simulated work: a random time in this range of milliseconds.
    pub work_ms: (u64, u64),
}

/// One job as a worker of [`drain`] ran it, timed on the client.
///
/// `start` is taken after the claim returned and `end` before `complete` is sent, so
/// the interval lies inside the time the server held the job `running`.
#[derive(Debug, Clone)]
pub struct Span {
    /// The job.
    pub id: JobId,
    /// The claimed job's priority.
    pub priority: i16,
    /// The claimed job's `run_at`.
    pub run_at: DateTime<Utc>,
    /// Its group.
    pub group: Option<String>,
    /// Its stage.
    pub stage: Option<i32>,
    /// Its attempt number.
    pub attempt: u32,
    /// When the worker started it.
    pub start: Instant,
    /// When the worker finished it (before completing it).
    pub end: Instant,
}

/// What a [`drain`] saw.
#[derive(Debug)]
pub struct Run {
    /// Every job run, in no particular order.
    pub spans: Vec<Span>,
    /// The most jobs the workers held at one time.
    pub max_in_flight: usize,
}

/// Most time a drain may take before it counts as stuck.
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `load.workers` claim-loop workers on `queue` until it has no unfinished job.
/// Each worker claims, "works" each job for a random time, and completes it.
///
/// # Errors
/// When a claim or complete fails, or the queue is not drained within a minute.
pub async fn drain(env: &Env, queue: &str, load: Load) -> anyhow::Result<Run> {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    // Set when a worker fails, so the others stop instead of waiting for its jobs.
    let abort = Arc::new(AtomicBool::new(false));
    // Connect every handle first, so all workers start at once.
    let mut handles = Vec::with_capacity(load.workers);
    for _ in 0..load.workers {
        handles.push(env.connect().await?);
    }
    let tasks: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(i, backend)| {
            let counters = (in_flight.clone(), max.clone());
            let (queue, abort) = (queue.to_owned(), abort.clone());
            tokio::spawn(async move {
                let name = format!("w{i}");
                let res = worker_loop(&*backend, &queue, name, load, counters, &abort).await;
                if res.is_err() {
                    abort.store(true, Ordering::SeqCst);
                }
                res
            })
        })
        .collect();
    let mut spans = Vec::new();
    for task in tasks {
        spans.extend(task.await??);
    }
    Ok(Run {
        spans,
        max_in_flight: max.load(Ordering::SeqCst),
    })
}

type Counters = (Arc<AtomicUsize>, Arc<AtomicUsize>);

async fn worker_loop(
    b: &dyn Backend,
    queue: &str,
    worker: String,
    load: Load,
    counters: Counters,
    abort: &AtomicBool,
) -> anyhow::Result<Vec<Span>> {
    let deadline = Instant::now() + DRAIN_DEADLINE;
    let mut spans = Vec::new();
    while !abort.load(Ordering::SeqCst) {
        ensure!(
            Instant::now() < deadline,
            "{worker}: queue not drained within {DRAIN_DEADLINE:?}"
        );
        let jobs = claim_as(b, queue, &worker, load.limit, LEASE).await?;
        if jobs.is_empty() {
            if unfinished(b, queue).await? == 0 {
                return Ok(spans);
            }
            // Momentarily nothing claimable (held groups, stages, the limit): retry soon.
            sleep(Duration::from_millis(2)).await;
            continue;
        }
        let runs = jobs
            .into_iter()
            .map(|job| run_one(b, job, load.work_ms, &counters));
        spans.extend(futures::future::try_join_all(runs).await?);
    }
    // Another worker failed; its error is the one drain reports.
    Ok(spans)
}

async fn run_one(
    b: &dyn Backend,
    job: ClaimedJob,
    work_ms: (u64, u64),
    counters: &Counters,
) -> anyhow::Result<Span> {
    let start = Instant::now();
    let now = counters.0.fetch_add(1, Ordering::SeqCst) + 1;
    counters.1.fetch_max(now, Ordering::SeqCst);
    sleep(Duration::from_millis(fastrand::u64(work_ms.0..=work_ms.1))).await;
    counters.0.fetch_sub(1, Ordering::SeqCst);
    let end = Instant::now();
    b.complete(&job.lease)
        .await
        .with_context(|| format!("completing job {} (attempt {})", job.id(), job.attempt()))?;
    Ok(Span {
        id: job.id(),
        attempt: job.attempt(),
        priority: job.priority,
        run_at: job.run_at,
        group: job.group,
        stage: job.stage,
        start,
        end,
    })
}

/// Checks that every id in `want` was run exactly once and nothing else was.
///
/// # Errors
/// When a job ran twice, never, or was not enqueued.
pub fn each_ran_once(spans: &[Span], want: &[JobId]) -> anyhow::Result<()> {
    let mut seen: HashMap<JobId, usize> = HashMap::new();
    for s in spans {
        *seen.entry(s.id).or_default() += 1;
    }
    let twice: Vec<_> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    ensure!(twice.is_empty(), "jobs claimed more than once: {twice:?}");
    let lost: Vec<_> = want.iter().filter(|id| !seen.contains_key(id)).collect();
    ensure!(
        lost.is_empty(),
        "{} jobs never claimed, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    ensure!(
        seen.len() == want.len(),
        "{} jobs claimed, {} enqueued",
        seen.len(),
        want.len()
    );
    Ok(())
}

/// Claims exactly the jobs `want` (see [`claim_exactly`]) and completes them.
///
/// # Errors
/// When the claim returns anything else or a complete fails.
pub async fn complete_all(b: &dyn Backend, queue: &str, want: &[JobId]) -> anyhow::Result<()> {
    for job in claim_exactly(b, queue, want).await? {
        b.complete(&job.lease).await?;
    }
    Ok(())
}
