//! SPEC M7 — finding jobs: a queue's jobs by filter, newest first, page by page.

use std::collections::HashSet;

use anyhow::ensure;
use relayq_core::{
    Backend, CompleteExt, JobFilter, JobId, JobPage, JobState, LIST_SCAN, NewJob, OnFailure, Retry,
};

use super::support::{claim_exactly, enqueue, enqueue_all, expect_invalid, one_job_per_state};
use crate::{Env, queue_name};

/// Every page of a listing from the newest job on, and how many calls it took.
async fn list_all(
    b: &dyn Backend,
    queue: &str,
    filter: &JobFilter,
    limit: u32,
) -> anyhow::Result<(Vec<JobId>, usize)> {
    let mut out = Vec::new();
    let mut before = None;
    for calls in 1.. {
        let JobPage { jobs, next } = b.list_jobs(queue, filter, before, limit).await?;
        ensure!(
            jobs.len() <= limit as usize,
            "a page of {limit} held {}",
            jobs.len()
        );
        ensure!(
            jobs.windows(2).all(|w| w[0] > w[1]),
            "a page out of order: {jobs:?}"
        );
        if let (Some(first), Some(b)) = (jobs.first(), before) {
            ensure!(*first < b, "a page began at {first}, not below {b}");
        }
        out.extend(jobs);
        match next {
            Some(n) => {
                ensure!(
                    before.is_none_or(|b| n < b),
                    "the listing did not move on: next {n} after {before:?}"
                );
                before = Some(n);
            }
            None => return Ok((out, calls)),
        }
    }
    unreachable!()
}

/// SPEC M7: each state's filter lists exactly that state's job, and the filters on
/// batch, stage, group and text (in the payload or the last error) each find theirs
/// and combine; with no filter every job is listed once, newest first, whatever the
/// page size; another queue's jobs never show; bad input names its field.
pub async fn m7_list_jobs_finds_any_job_by_filter(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m7");
    let other = queue_name("m7other");
    enqueue(b, NewJob::new(&other, b"elsewhere load-orders".to_vec())).await?;
    let by_state = one_job_per_state(b, &q).await?;
    for (state, id) in &by_state {
        let (got, _) = list_all(b, &q, &JobFilter::all().state(*state), 1).await?;
        ensure!(
            got == [*id],
            "state {state}: listed {got:?}, expected [{id}]"
        );
    }
    let mut all_states: Vec<JobId> = by_state.values().copied().collect();
    all_states.sort_unstable_by(|a, b| b.cmp(a));
    let (got, _) = list_all(b, &q, &JobFilter::all(), 3).await?;
    ensure!(got == all_states, "listed {got:?}, expected {all_states:?}");

    // The filters, in a queue of their own.
    let q = queue_name("m7filters");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let staged = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"{\"name\":\"load-orders\"}".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"{\"name\":\"load-customers\"}".to_vec()).in_batch(batch.id, 2),
            NewJob::new(&q, b"{\"name\":\"report\"}".to_vec())
                .in_batch(batch.id, 2)
                .group("reports"),
        ],
    )
    .await?;
    let failing = enqueue(b, NewJob::new(&q, b"plain".to_vec()).max_attempts(1)).await?;
    let lease = claim_exactly(b, &q, &[staged[0], failing])
        .await?
        .into_iter()
        .find(|c| c.id() == failing)
        .map(|c| c.lease)
        .ok_or_else(|| anyhow::anyhow!("job {failing} not claimed"))?;
    b.fail(&lease, "disk full on /var/tmp", Retry::Never)
        .await?;

    let cases: [(&str, JobFilter, Vec<JobId>); 7] = [
        (
            "batch",
            JobFilter::all().batch(batch.id),
            staged.iter().rev().copied().collect(),
        ),
        (
            "stage",
            JobFilter::all().batch(batch.id).stage(2),
            vec![staged[2], staged[1]],
        ),
        ("group", JobFilter::all().group("reports"), vec![staged[2]]),
        (
            "payload text",
            JobFilter::all().text("load-"),
            vec![staged[1], staged[0]],
        ),
        (
            "error text",
            JobFilter::all().text("/var/tmp"),
            vec![failing],
        ),
        (
            "state and text",
            JobFilter::all().state(JobState::Running).text("load-"),
            vec![staged[0]],
        ),
        ("case matters", JobFilter::all().text("LOAD-"), vec![]),
    ];
    for (what, filter, want) in cases {
        let (got, _) = list_all(b, &q, &filter, 2).await?;
        ensure!(got == want, "{what}: listed {got:?}, expected {want:?}");
    }

    let mut every: Vec<JobId> = staged.clone();
    every.push(failing);
    every.sort_unstable_by(|a, b| b.cmp(a));
    for limit in [1, 3, 1000] {
        let (got, _) = list_all(b, &q, &JobFilter::all(), limit).await?;
        ensure!(
            got == every,
            "pages of {limit}: listed {got:?}, expected {every:?}"
        );
    }
    let below = every[0];
    let page = b.list_jobs(&q, &JobFilter::all(), Some(below), 2).await?;
    ensure!(
        page.jobs == every[1..3],
        "below {below}: {:?}, expected {:?}",
        page.jobs,
        &every[1..3]
    );

    let all = JobFilter::all();
    expect_invalid(b.list_jobs(&q, &all, None, 0).await, "limit", "limit 0")?;
    expect_invalid(
        b.list_jobs(&q, &all, None, 1001).await,
        "limit",
        "limit 1001",
    )?;
    expect_invalid(
        b.list_jobs(&q, &JobFilter::all().text(""), None, 5).await,
        "text",
        "an empty text",
    )?;
    let long = "x".repeat(relayq_core::MAX_FILTER_TEXT + 1);
    expect_invalid(
        b.list_jobs(&q, &JobFilter::all().text(long), None, 5).await,
        "text",
        "a long text",
    )?;
    expect_invalid(
        b.list_jobs(&q, &JobFilter::all().group(""), None, 5).await,
        "group",
        "an empty group",
    )?;
    expect_invalid(
        b.list_jobs("bad name!", &all, None, 5).await,
        "queue",
        "a bad queue",
    )?;
    Ok(())
}

/// SPEC M7: a filter that matches one old job below more jobs than one call looks at
/// still finds it, by following `next` through pages that may be empty; every call
/// looks at no more than `LIST_SCAN` jobs, so the calls are bounded, and the listing
/// ends.
pub async fn m7_a_rare_match_is_found_past_the_scan_bound(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m7scan");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let needle = enqueue(
        b,
        NewJob::new(&q, b"the needle".to_vec()).in_batch(batch.id, 1),
    )
    .await?;
    let n = LIST_SCAN as usize + 50;
    let mut hay = Vec::with_capacity(n);
    while hay.len() < n {
        let chunk = (n - hay.len()).min(1000);
        let jobs = (0..chunk)
            .map(|_| NewJob::new(&q, b"hay".to_vec()))
            .collect();
        hay.extend(enqueue_all(b, jobs).await?);
    }
    let (got, calls) = list_all(b, &q, &JobFilter::all().text("needle"), 10).await?;
    ensure!(got == [needle], "listed {got:?}, expected [{needle}]");
    // Filters on columns the other jobs leave empty (no batch, no group) past the
    // bound too.
    let (got, _) = list_all(b, &q, &JobFilter::all().batch(batch.id).stage(1), 10).await?;
    ensure!(
        got == [needle],
        "by batch: listed {got:?}, expected [{needle}]"
    );
    let (got, _) = list_all(b, &q, &JobFilter::all().group("none"), 10).await?;
    ensure!(got.is_empty(), "by an unused group: listed {got:?}");
    ensure!(calls >= 2, "{} jobs were looked at in one call", n + 1);
    // A backend may look at fewer than LIST_SCAN jobs a call, but always some.
    ensure!(calls <= n + 1, "{calls} calls for {} jobs", n + 1);
    let (all, _) = list_all(b, &q, &JobFilter::all(), 1000).await?;
    let distinct: HashSet<_> = all.iter().collect();
    ensure!(
        all.len() == n + 1 && distinct.len() == n + 1,
        "listed {} jobs ({} distinct), expected {}",
        all.len(),
        distinct.len(),
        n + 1
    );
    Ok(())
}

/// SPEC M8: `delete_jobs` removes the finished jobs named (succeeded, dead,
/// cancelled) with their logs, as pruning would, and leaves unfinished ones, unknown
/// ids and another queue's jobs; a second delete finds nothing; no id, or too many, is
/// `InvalidInput` on `ids`.
pub async fn m8_delete_jobs_removes_only_finished_ones(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m8");
    let other = queue_name("m8other");
    let by_state = one_job_per_state(b, &q).await?;
    let theirs = enqueue(b, NewJob::new(&other, b"theirs".to_vec())).await?;
    b.cancel_job(&other, theirs).await?;
    let finished = [JobState::Succeeded, JobState::Dead, JobState::Cancelled];
    let mut named: Vec<JobId> = by_state.values().copied().collect();
    named.extend([theirs, JobId(theirs.0 + 1_000_000)]);
    let n = b.delete_jobs(&q, &named).await?;
    ensure!(n == 3, "deleted {n}, expected the 3 finished jobs");
    for (state, id) in &by_state {
        let read = b.job(&q, *id).await;
        if finished.contains(state) {
            ensure!(
                matches!(read, Err(relayq_core::Error::NotFound { .. })),
                "the {state} job {id} should be gone: {read:?}"
            );
        } else {
            super::support::expect_state(b, &q, *id, *state).await?;
        }
    }
    super::support::expect_state(b, &other, theirs, JobState::Cancelled).await?;
    let stats = b.queue_stats(&q).await?;
    for state in finished {
        ensure!(stats.count(state) == 0, "{state} still counted: {stats:?}");
    }
    let (listed, _) = list_all(b, &q, &JobFilter::all(), 100).await?;
    ensure!(listed.len() == 5, "listed {listed:?} after the delete");
    ensure!(
        b.delete_jobs(&q, &named).await? == 0,
        "a second delete found jobs"
    );
    expect_invalid(b.delete_jobs(&q, &[]).await, "ids", "no id")?;
    let many: Vec<JobId> = (1..=1001).map(JobId).collect();
    expect_invalid(b.delete_jobs(&q, &many).await, "ids", "1001 ids")?;
    Ok(())
}

/// SPEC M10: `run_now` makes due only the jobs that wait for nothing but their time,
/// a scheduled job (its group's next included) and a retry in its backoff; it leaves
/// blocked, due, running and other queues' jobs as they are.
pub async fn m10_run_now_makes_only_time_bound_jobs_due(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m10");
    let other = queue_name("m10other");
    let hour = std::time::Duration::from_secs(3600);
    let job = |name: &str| NewJob::new(&q, name.as_bytes().to_vec());
    let running = enqueue(b, job("running")).await?;
    claim_exactly(b, &q, &[running]).await?;
    let retrying = enqueue(b, job("retrying")).await?;
    let got = claim_exactly(b, &q, &[retrying]).await?;
    b.fail(&got[0].lease, "later", Retry::After(hour)).await?;
    let scheduled = enqueue(b, job("scheduled").delay(hour)).await?;
    let next = enqueue(b, job("next").group("g").delay(hour)).await?;
    let behind = enqueue(b, job("behind").group("g").delay(2 * hour)).await?;
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let low = enqueue(b, job("low").in_batch(batch.id, 1).delay(2 * hour)).await?;
    let staged = enqueue(b, job("staged").in_batch(batch.id, 2).delay(hour)).await?;
    let due = enqueue(b, job("due")).await?;
    let theirs = enqueue(b, NewJob::new(&other, b"theirs".to_vec()).delay(hour)).await?;
    let named = [
        running,
        retrying,
        scheduled,
        next,
        behind,
        staged,
        due,
        theirs,
        JobId(due.0 + 1_000_000),
    ];
    let n = b.run_now(&q, &named).await?;
    ensure!(
        n == 3,
        "run_now moved {n}, expected the retry, the scheduled job and its group's next"
    );
    // Due now, behind the job that was due already; ties in run_at go by id.
    claim_exactly(b, &q, &[due, retrying, scheduled, next]).await?;
    super::support::expect_state(b, &q, behind, JobState::Blocked).await?;
    super::support::expect_state(b, &q, staged, JobState::Blocked).await?;
    super::support::expect_state(b, &q, low, JobState::Scheduled).await?;
    super::support::expect_state(b, &other, theirs, JobState::Scheduled).await?;
    ensure!(
        b.run_now(&q, &named).await? == 0,
        "a second run_now found jobs to move"
    );
    expect_invalid(b.run_now(&q, &[]).await, "ids", "no id")?;
    let many: Vec<JobId> = (1..=1001).map(JobId).collect();
    expect_invalid(b.run_now(&q, &many).await, "ids", "1001 ids")?;
    Ok(())
}
