//! SPEC C — claim.

use std::{
    collections::HashSet,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::ensure;
use chrono::{DateTime, TimeDelta, Utc};
use relayq_core::{
    AttemptOutcome, Backend, ClaimRequest, ClaimedJob, CompleteExt, DEFAULT_RETENTION, JobId,
    JobState, NewJob, QueueUpdate,
};
use tokio::time::{Instant, timeout};

use super::support::{
    LEASE, PATIENCE, SHORT_LEASE, TIME_SLACK, claim, claim_as, claim_exactly, claim_nothing,
    claimed_at, enqueue, enqueue_all, enqueue_n, expect_invalid, expect_stale, expect_state, ids,
    poll_claim, state,
};
use crate::{Env, poll_until, queue_name};

/// SPEC C1: at most `limit` jobs, each with a fresh token, attempt 1, its lease expiry
/// and the job's fields.
pub async fn c1_claim_returns_leases(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c1");
    let mut jobs: Vec<_> = (0..4).map(|i| NewJob::new(&q, vec![i])).collect();
    jobs.push(
        NewJob::new(&q, b"full".to_vec())
            .priority(-3)
            .group("g1")
            .max_attempts(7)
            .enqueued_by("tester"),
    );
    let want = enqueue_all(b, jobs).await?;
    let got = claim_as(b, &q, "worker-a", 3, LEASE).await?;
    ensure!(got.len() == 3, "limit 3 returned {} jobs", got.len());
    let full = &got[0];
    ensure!(
        full.id() == want[4],
        "the priority -3 job should come first, got {:?}",
        ids(&got)
    );
    ensure!(
        full.payload == b"full"
            && full.priority == -3
            && full.group.as_deref() == Some("g1")
            && full.max_attempts == 7
            && full.enqueued_by.as_deref() == Some("tester")
            && full.batch.is_none()
            && full.stage.is_none(),
        "claimed job's fields differ from the enqueued ones: {full:?}"
    );
    let tokens: HashSet<_> = got.iter().map(|j| j.lease.token).collect();
    ensure!(tokens.len() == 3, "lease tokens are not distinct");
    for job in &got {
        let l = &job.lease;
        ensure!(
            l.attempt == 1,
            "first claim of job {} has attempt {}",
            l.job,
            l.attempt
        );
        ensure!(
            l.queue == q && l.worker == "worker-a",
            "lease names queue {:?} worker {:?}",
            l.queue,
            l.worker
        );
        let at = claimed_at(job, LEASE);
        ensure!(
            at + TIME_SLACK >= job.run_at && at <= job.run_at + TimeDelta::seconds(10),
            "lease expiry {} is not about claim time + 30 s (run_at {})",
            l.expires_at,
            job.run_at
        );
    }
    let rest = claim(b, &q, 10).await?;
    ensure!(
        rest.len() == 2,
        "expected the 2 remaining jobs, got {}",
        rest.len()
    );
    ensure!(
        !rest.iter().any(|j| tokens.contains(&j.lease.token)),
        "a token was reused"
    );
    claim_nothing(b, &q, "every job is held").await
}

/// SPEC C1: `limit` outside 1..=1000, a zero lease, a bad worker or queue name are
/// `InvalidInput` naming the field.
pub async fn c1_claim_rejects_bad_requests(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c1bad");
    enqueue_n(b, &q, 2).await?;
    let req = |limit, lease| ClaimRequest::new(&q, "w", limit, lease);
    expect_invalid(b.claim(req(0, LEASE)).await, "limit", "limit 0")?;
    expect_invalid(b.claim(req(1001, LEASE)).await, "limit", "limit 1001")?;
    expect_invalid(b.claim(req(1, Duration::ZERO)).await, "lease", "zero lease")?;
    let long = Duration::from_secs(8 * 24 * 3600);
    expect_invalid(b.claim(req(1, long)).await, "lease", "8-day lease")?;
    expect_invalid(
        b.claim(ClaimRequest::new(&q, "", 1, LEASE)).await,
        "worker",
        "empty worker",
    )?;
    expect_invalid(
        b.claim(ClaimRequest::new("a b", "w", 1, LEASE)).await,
        "queue",
        "bad queue",
    )?;
    let all = b.claim(req(1000, LEASE)).await?;
    ensure!(
        all.len() == 2,
        "limit 1000 returned {} of 2 jobs; rejected claims took some?",
        all.len()
    );
    Ok(())
}

/// SPEC C3: claims return the earliest jobs by `(priority, run_at, id)`, each result
/// sorted so.
pub async fn c3_claims_follow_order_key(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c3");
    let hour_ago = Utc::now().timestamp() - 3600;
    let past = |min: i64| DateTime::from_timestamp(hour_ago + 60 * min, 0).unwrap_or_default();
    let job_ids = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"0".to_vec()).run_at(past(2)),
            NewJob::new(&q, b"1".to_vec()).run_at(past(1)),
            NewJob::new(&q, b"2".to_vec()).priority(-5),
            NewJob::new(&q, b"3".to_vec()).run_at(past(1)),
            NewJob::new(&q, b"4".to_vec()).priority(3).run_at(past(0)),
            NewJob::new(&q, b"5".to_vec()),
            NewJob::new(&q, b"6".to_vec()).priority(-5),
        ],
    )
    .await?;
    let want: Vec<_> = [2, 6, 1, 3, 0, 5, 4].iter().map(|&i| job_ids[i]).collect();
    let first = claim(b, &q, 3).await?;
    let second = claim(b, &q, 10).await?;
    for part in [&first, &second] {
        let keys: Vec<_> = part
            .iter()
            .map(|j| (j.priority, j.run_at, j.id()))
            .collect();
        ensure!(
            keys.is_sorted(),
            "one claim's jobs are not sorted by order key: {keys:?}"
        );
    }
    let got: Vec<_> = ids(&first).into_iter().chain(ids(&second)).collect();
    ensure!(
        got == want,
        "claim order {got:?}, expected by (priority, run_at, id) {want:?}"
    );
    Ok(())
}

/// SPEC C4: an empty queue, and a queue whose jobs another claimer holds, answer at
/// once, also to many claimers at a time.
pub async fn c4_claims_do_not_wait(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c4");
    let quick = Duration::from_secs(2);
    let empty = timeout(quick, claim(b, &q, 10)).await;
    ensure!(
        matches!(&empty, Ok(Ok(v)) if v.is_empty()),
        "claim on an empty queue: {empty:?}"
    );
    let all = enqueue_n(b, &q, 10).await?;
    let held = claim_exactly(b, &q, &all).await?;
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let other = env.connect().await?;
        let q = q.clone();
        claimers.push(tokio::spawn(async move { claim(&*other, &q, 5).await }));
    }
    let started = Instant::now();
    for c in claimers {
        let got = timeout(quick, c).await;
        ensure!(
            matches!(&got, Ok(Ok(Ok(v))) if v.is_empty()),
            "a claim while another claimer holds every job: {got:?}"
        );
    }
    ensure!(
        started.elapsed() < quick,
        "claims waited {:?}",
        started.elapsed()
    );
    for job in held {
        b.complete(&job.lease).await?;
    }
    Ok(())
}

/// SPEC C5, L1, L3, L5: an expired lease is taken over with attempt + 1; the zombie's
/// complete and heartbeat are `StaleLease`; the log records the expiry.
pub async fn c5_expired_lease_is_taken_over(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c5");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    // Open the second handle first: opening one can be slow on a loaded machine.
    let other = env.connect().await?;
    let zombie = claim_as(b, &q, "zombie", 1, SHORT_LEASE).await?;
    ensure!(
        ids(&zombie) == [id],
        "first claim returned {:?}",
        ids(&zombie)
    );
    let early = claim_as(&*other, &q, "heir", 1, LEASE).await?;
    let taken = if let Some(job) = early.first() {
        // Only legal if, by server time, this claim ran after the lease expired (a slow
        // machine can take longer than the short lease between two claims).
        ensure!(
            claimed_at(job, LEASE) + TIME_SLACK >= zombie[0].lease.expires_at,
            "the job was taken over at {} while its lease held until {}",
            claimed_at(job, LEASE),
            zombie[0].lease.expires_at
        );
        early
    } else {
        poll_claim(
            &*other,
            &q,
            "heir",
            1,
            LEASE,
            "the expired job to be claimable",
        )
        .await?
    };
    ensure!(
        taken[0].id() == id && taken[0].attempt() == 2,
        "takeover gave {:?}",
        taken[0].lease
    );
    let old = &zombie[0].lease;
    expect_stale(
        b.heartbeat(old, LEASE).await,
        "zombie heartbeat after takeover",
    )?;
    expect_stale(b.complete(old).await, "zombie complete after takeover")?;
    expect_state(b, &q, id, JobState::Running).await?;
    other.complete(&taken[0].lease).await?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Succeeded,
        "the heir's complete left {}",
        info.state
    );
    let log = &info.attempt_log;
    ensure!(
        log.len() == 2,
        "expected 2 attempts in the log, got {log:?}"
    );
    ensure!(
        log[0].worker == "zombie"
            && log[0].outcome == AttemptOutcome::Expired
            && log[0].error.as_deref() == Some("lease expired")
            && log[0].ended_at.is_some(),
        "first attempt should be an expiry of worker zombie: {:?}",
        log[0]
    );
    ensure!(
        log[1].worker == "heir" && log[1].outcome == AttemptOutcome::Succeeded,
        "second attempt: {:?}",
        log[1]
    );
    Ok(())
}

/// SPEC C5: a job whose lease expired with no attempts left becomes `dead` ("lease
/// expired") at the next claim.
pub async fn c5_expired_without_attempts_dies_at_claim(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c5dead");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).max_attempts(1)).await?;
    claim_exactly_short(b, &q, id).await?;
    poll_until("the expired job to die at a claim", PATIENCE, || async {
        let got = claim(b, &q, 10).await?;
        ensure!(
            got.is_empty(),
            "a job with no attempts left was claimed again: {:?}",
            ids(&got)
        );
        Ok((state(b, &q, id).await? == JobState::Dead).then_some(()))
    })
    .await?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.last_error.as_deref() == Some("lease expired") && info.attempts == 1,
        "dead job: error {:?}, attempts {}",
        info.last_error,
        info.attempts
    );
    ensure!(
        b.dead_jobs(&q, 10).await?.iter().any(|j| j.id == id),
        "dead_jobs does not list it"
    );
    Ok(())
}

/// SPEC C5: `maintain` makes an expired job claimable again while it has attempts, and
/// `dead` ("lease expired") when it has none.
pub async fn c5_maintain_requeues_then_kills(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c5maint");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).max_attempts(2)).await?;
    for attempt in 1..=2 {
        let job = claim_exactly_short(b, &q, id).await?;
        ensure!(
            job.attempt() == attempt,
            "claim {attempt} has attempt {}",
            job.attempt()
        );
        let (requeued, dead) = (AtomicU64::new(0), AtomicU64::new(0));
        poll_until("maintain to end the expired lease", PATIENCE, || async {
            let m = b.maintain(&q, DEFAULT_RETENTION).await?;
            ensure!(
                m.pruned == 0,
                "maintain with 7-day retention pruned {}",
                m.pruned
            );
            requeued.fetch_add(m.requeued, Ordering::SeqCst);
            dead.fetch_add(m.dead, Ordering::SeqCst);
            Ok((m.requeued + m.dead > 0).then_some(()))
        })
        .await?;
        let seen = (requeued.into_inner(), dead.into_inner());
        let want = if attempt == 1 { (1, 0) } else { (0, 1) };
        ensure!(
            seen == want,
            "after expiry {attempt} maintain reported (requeued, dead) {seen:?}, expected {want:?}"
        );
    }
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Dead && info.last_error.as_deref() == Some("lease expired"),
        "after the last expiry: {} with error {:?}",
        info.state,
        info.last_error
    );
    claim_nothing(b, &q, "the job is dead").await
}

/// Claims `id` alone with [`SHORT_LEASE`].
async fn claim_exactly_short(b: &dyn Backend, q: &str, id: JobId) -> anyhow::Result<ClaimedJob> {
    let mut got = claim_as(b, q, "short", 1, SHORT_LEASE).await?;
    ensure!(
        ids(&got) == [id],
        "expected to claim {id}, got {:?}",
        ids(&got)
    );
    Ok(got.remove(0))
}

/// SPEC C6: `max_running` caps one claim and later claims; lifting it lets the rest
/// run; zero is `InvalidInput` on `max_running`.
pub async fn c6_max_running_caps_claims(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c6cap");
    expect_invalid(
        b.set_max_running(&q, Some(0)).await,
        "max_running",
        "max_running 0",
    )?;
    b.set_max_running(&q, Some(2)).await?;
    ensure!(
        b.queue_stats(&q).await?.max_running == Some(2),
        "stats do not show max_running 2"
    );
    enqueue_n(b, &q, 5).await?;
    let first = claim(b, &q, 5).await?;
    ensure!(
        first.len() == 2,
        "with max_running 2 a claim of 5 returned {}",
        first.len()
    );
    claim_nothing(b, &q, "2 of max 2 are running").await?;
    b.complete(&first[0].lease).await?;
    let one = claim(b, &q, 5).await?;
    ensure!(
        one.len() == 1,
        "after one finished, a claim returned {} (expected 1)",
        one.len()
    );
    b.set_max_running(&q, None).await?;
    let rest = claim(b, &q, 5).await?;
    ensure!(
        rest.len() == 2,
        "after lifting the limit a claim returned {} (expected 2)",
        rest.len()
    );
    let running = b.running(&q).await?.len();
    ensure!(running == 4, "running() lists {running} jobs, 4 run");
    Ok(())
}

/// SPEC C5, C6: in a queue at its `max_running`, a job whose lease expired no longer
/// takes a slot: the next claim takes it over (attempt 2) instead of finding the queue
/// full forever.
pub async fn c6_expired_lease_frees_its_slot(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c6exp");
    b.set_max_running(&q, Some(1)).await?;
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let zombie = claim_as(b, &q, "zombie", 1, SHORT_LEASE).await?;
    ensure!(
        ids(&zombie) == [id],
        "first claim returned {:?}",
        ids(&zombie)
    );
    let taken = poll_claim(
        b,
        &q,
        "heir",
        1,
        LEASE,
        "the expired job to be taken over in a full queue",
    )
    .await?;
    ensure!(
        taken[0].id() == id && taken[0].attempt() == 2,
        "takeover gave {:?}",
        taken[0].lease
    );
    ensure!(
        b.running(&q).await?.len() == 1,
        "one job runs, max_running 1"
    );
    Ok(())
}

/// SPEC C6: a paused queue returns nothing; enqueue still works; resume claims again.
pub async fn c6_pause_stops_claims_until_resume(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c6pause");
    enqueue_n(b, &q, 2).await?;
    b.pause(&q).await?;
    ensure!(
        b.queue_stats(&q).await?.paused,
        "stats do not show the queue paused"
    );
    claim_nothing(b, &q, "the queue is paused").await?;
    enqueue_n(b, &q, 1).await?;
    let other = env.connect().await?;
    claim_nothing(&*other, &q, "the queue is paused (other handle)").await?;
    b.resume(&q).await?;
    ensure!(
        !b.queue_stats(&q).await?.paused,
        "stats still show the queue paused"
    );
    let got = claim(&*other, &q, 10).await?;
    ensure!(
        got.len() == 3,
        "after resume a claim returned {} of 3 jobs",
        got.len()
    );
    Ok(())
}

/// SPEC C6: one `update_queue` call changes every setting it names and leaves the
/// others as they were; a zero `max_running` is refused naming the field, and nothing
/// of the call is stored.
pub async fn c6_update_queue_changes_only_what_it_names(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c6update");
    enqueue_n(b, &q, 3).await?;
    b.update_queue(&q, QueueUpdate::default().paused(true).max_running(Some(1)))
        .await?;
    let stats = b.queue_stats(&q).await?;
    ensure!(
        stats.paused && stats.max_running == Some(1),
        "one update set paused {} and max_running {:?}",
        stats.paused,
        stats.max_running
    );
    claim_nothing(b, &q, "the queue is paused").await?;
    let refused = b
        .update_queue(
            &q,
            QueueUpdate::default().paused(false).max_running(Some(0)),
        )
        .await;
    ensure!(
        refused
            .as_ref()
            .err()
            .and_then(relayq_core::Error::invalid_field)
            == Some("max_running"),
        "a zero max_running: expected InvalidInput on max_running, got {refused:?}"
    );
    ensure!(
        b.queue_stats(&q).await?.paused,
        "a refused update still resumed the queue"
    );
    b.update_queue(&q, QueueUpdate::default().paused(false))
        .await?;
    let stats = b.queue_stats(&q).await?;
    ensure!(
        !stats.paused && stats.max_running == Some(1),
        "a resume alone changed max_running to {:?}",
        stats.max_running
    );
    let got = claim(b, &q, 10).await?;
    ensure!(
        got.len() == 1,
        "max_running 1 let {} jobs be claimed",
        got.len()
    );
    Ok(())
}
