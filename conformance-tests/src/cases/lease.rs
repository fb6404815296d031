//! SPEC L — lease: complete, fail, heartbeat, release, the attempt log, settle_many.

use std::time::Duration;

use anyhow::{bail, ensure};
use relayq_core::{
    AttemptOutcome, CompleteExt, JobState, Lease, LeaseToken, NewJob, Retry, Settle, Settled,
};
use tokio::time::{Instant, sleep};

use super::support::{
    LEASE, SHORT_LEASE, TIME_SLACK, claim, claim_as, claim_exactly, claim_nothing, claimed_at,
    delta, enqueue, enqueue_n, expect_invalid, expect_stale, expect_state, ids, poll_claim,
};
use crate::{Env, queue_name};

/// A copy of `lease` with a random token: a lease nobody holds.
fn forged(lease: &Lease) -> Lease {
    Lease {
        token: LeaseToken::random(),
        ..lease.clone()
    }
}

/// SPEC L1: complete succeeds once; the second complete is `StaleLease`.
pub async fn l1_complete_twice_is_stale(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l1twice");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    b.complete(&job.lease).await?;
    expect_state(b, &q, id, JobState::Succeeded).await?;
    expect_stale(b.complete(&job.lease).await, "second complete")?;
    expect_stale(b.release(&job.lease).await, "release after complete")?;
    expect_stale(
        b.fail(&job.lease, "late", Retry::Never).await,
        "fail after complete",
    )?;
    expect_state(b, &q, id, JobState::Succeeded).await
}

/// SPEC L1, L3: a token that never held the job is `StaleLease` for every settle and
/// heartbeat, and changes nothing: the real lease still completes.
pub async fn l1_wrong_token_changes_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l1forged");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    let fake = forged(&job.lease);
    expect_stale(b.complete(&fake).await, "complete with a forged token")?;
    expect_stale(
        b.fail(&fake, "x", Retry::Never).await,
        "fail with a forged token",
    )?;
    expect_stale(b.release(&fake).await, "release with a forged token")?;
    expect_stale(
        b.heartbeat(&fake, LEASE).await,
        "heartbeat with a forged token",
    )?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Running && info.attempts == 1 && info.last_error.is_none(),
        "forged tokens changed the job: {} attempts {} error {:?}",
        info.state,
        info.attempts,
        info.last_error
    );
    b.complete(&job.lease).await?;
    expect_state(b, &q, id, JobState::Succeeded).await
}

/// SPEC L1, L3, L6: a lease whose id and token are right but whose queue is another
/// is `StaleLease` for every settle and heartbeat, alone or in a call, and changes
/// nothing in either queue, though the other queue has a running job too.
pub async fn l1_lease_of_another_queue_changes_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let (q, other) = (queue_name("l1queue"), queue_name("l1other"));
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let there = enqueue(b, NewJob::new(&other, b"y".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    let theirs = claim_exactly(b, &other, &[there]).await?.remove(0);
    let moved = Lease {
        queue: other.clone(),
        ..job.lease.clone()
    };
    expect_stale(b.complete(&moved).await, "complete naming another queue")?;
    expect_stale(
        b.fail(&moved, "x", Retry::Never).await,
        "fail naming another queue",
    )?;
    expect_stale(b.release(&moved).await, "release naming another queue")?;
    expect_stale(
        b.heartbeat(&moved, LEASE).await,
        "heartbeat naming another queue",
    )?;
    // A call of completions alone, and a call of mixed outcomes: backends may judge
    // the two on different paths.
    let alone = b.settle_many(vec![Settle::complete(moved.clone())]).await?;
    let mixed = b
        .settle_many(vec![
            Settle::complete(moved.clone()),
            Settle::fail(moved.clone(), "x", Retry::After(LEASE)),
        ])
        .await?;
    ensure!(
        matches!(shape(&alone).as_slice(), [Err(true)])
            && matches!(shape(&mixed).as_slice(), [Err(true), Err(true)]),
        "settle_many naming another queue: {alone:?} {mixed:?}"
    );
    for (queue, id) in [(&q, id), (&other, there)] {
        let info = b.job(queue, id).await?;
        ensure!(
            info.state == JobState::Running
                && info.attempts == 1
                && info.last_error.is_none()
                && info.attempt_log.iter().all(|a| a.ended_at.is_none()),
            "a lease naming another queue changed job {id} of {queue}: {} attempts {} \
             error {:?} log {:?}",
            info.state,
            info.attempts,
            info.last_error,
            info.attempt_log
        );
    }
    b.complete(&job.lease).await?;
    b.complete(&theirs.lease).await?;
    expect_state(b, &q, id, JobState::Succeeded).await?;
    expect_state(b, &other, there, JobState::Succeeded).await
}

/// SPEC L5: text reported with an outcome (a command's output, say) is kept with the
/// attempt in the execution log, for successes and failures alike.
pub async fn l5_attempt_log_keeps_output(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l5out");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).max_attempts(2)).await?;
    let first = claim_exactly(b, &q, &[id]).await?.remove(0);
    let failed = Settle::fail(first.lease, "exit 1", Retry::After(Duration::ZERO))
        .with_output(Some("first try\n".into()));
    b.settle_one(failed).await?;
    let second = poll_claim(b, &q, "w", 1, LEASE, "the retry")
        .await?
        .remove(0);
    let done = Settle::complete(second.lease).with_output(Some("it's done; -- {ok}\n".into()));
    b.settle_one(done).await?;
    let log = b.job(&q, id).await?.attempt_log;
    let outputs: Vec<Option<&str>> = log.iter().map(|a| a.output.as_deref()).collect();
    ensure!(
        outputs == [Some("first try\n"), Some("it's done; -- {ok}\n")],
        "outputs in the log: {outputs:?}"
    );
    Ok(())
}

/// SPEC L1, L3, C5: a lease past its expiry no longer holds, even before anyone took
/// the job over: complete, fail, release and heartbeat are `StaleLease`; the next claim
/// takes the job as attempt 2.
pub async fn l1_expired_lease_no_longer_holds(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l1expired");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_as(b, &q, "late", 1, SHORT_LEASE).await?.remove(0);
    // A probe job in another queue, due just after the lease's expiry, shows when the
    // server's clock has passed it without touching the leased job.
    let probe_q = queue_name("l1probe");
    let due = job.lease.expires_at + TIME_SLACK;
    enqueue(b, NewJob::new(&probe_q, b"probe".to_vec()).run_at(due)).await?;
    poll_claim(
        b,
        &probe_q,
        "probe",
        1,
        LEASE,
        "server time to pass the lease expiry",
    )
    .await?;
    let lease = &job.lease;
    expect_stale(
        b.heartbeat(lease, LEASE).await,
        "heartbeat of an expired lease",
    )?;
    expect_stale(b.complete(lease).await, "complete of an expired lease")?;
    expect_stale(
        b.fail(lease, "late", Retry::Never).await,
        "fail of an expired lease",
    )?;
    expect_stale(b.release(lease).await, "release of an expired lease")?;
    let again = claim_exactly(b, &q, &[id]).await?.remove(0);
    ensure!(
        again.attempt() == 2,
        "the claim after expiry has attempt {}",
        again.attempt()
    );
    b.complete(&again.lease).await?;
    expect_state(b, &q, id, JobState::Succeeded).await
}

/// SPEC L2: a failure with attempts left makes the job `retrying` until the given
/// time (`Settled::Retrying { at }`), keeps the error, then it runs again as attempt 2.
pub async fn l2_fail_with_attempts_left_retries(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l2retry");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).max_attempts(2)).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    let wait = Duration::from_millis(400);
    let Settled::Retrying { at } = b.fail(&job.lease, "boom 1", Retry::After(wait)).await? else {
        bail!("fail with attempts left did not answer Retrying");
    };
    let earliest = claimed_at(&job, LEASE) + delta(wait);
    ensure!(
        at + TIME_SLACK >= earliest,
        "retry at {at}, before claim time + 400 ms ({earliest})"
    );
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Retrying,
        "after fail the job is {}",
        info.state
    );
    ensure!(
        info.last_error.as_deref() == Some("boom 1"),
        "error kept: {:?}",
        info.last_error
    );
    ensure!(
        (info.run_at - at).abs() <= TIME_SLACK,
        "job run_at {} differs from retry at {at}",
        info.run_at
    );
    claim_nothing(b, &q, "the job waits for its retry time").await?;
    let again = poll_claim(b, &q, "w", 1, LEASE, "the retried job")
        .await?
        .remove(0);
    ensure!(
        again.id() == id && again.attempt() == 2,
        "retry claim gave {:?}",
        again.lease
    );
    ensure!(
        claimed_at(&again, LEASE) + TIME_SLACK >= at,
        "claimed before its retry time {at}"
    );
    let r = b.fail(&again.lease, "boom 2", Retry::After(wait)).await?;
    ensure!(
        r == Settled::Dead,
        "failing the last attempt gave {r:?}, expected Dead"
    );
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Dead
            && info.last_error.as_deref() == Some("boom 2")
            && info.attempts == 2,
        "after the last failure: {} error {:?} attempts {}",
        info.state,
        info.last_error,
        info.attempts
    );
    Ok(())
}

/// SPEC L2: the default backoff of a first failure is between half and all of the
/// 1 s base (exponential with equal jitter).
pub async fn l2_default_backoff_is_about_one_second(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l2backoff");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    let Settled::Retrying { at } = b.fail(&job.lease, "boom", Retry::Backoff).await? else {
        bail!("fail with attempts left did not answer Retrying");
    };
    let from = claimed_at(&job, LEASE);
    let backoff = at - from;
    ensure!(
        backoff + TIME_SLACK >= delta(Duration::from_millis(500))
            && backoff <= delta(Duration::from_secs(6)),
        "first default backoff: retry {backoff} after the claim, expected 0.5 s to 1 s after the failure"
    );
    Ok(())
}

/// SPEC L2: `Retry::Never`, or a failure of the last attempt, makes the job `dead`.
pub async fn l2_permanent_failure_is_dead(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l2dead");
    let never = enqueue(b, NewJob::new(&q, b"never".to_vec()).max_attempts(5)).await?;
    let last = enqueue(b, NewJob::new(&q, b"last".to_vec()).max_attempts(1)).await?;
    let jobs = claim_exactly(b, &q, &[never, last]).await?;
    let r = b.fail(&jobs[0].lease, "permanent", Retry::Never).await?;
    ensure!(
        r == Settled::Dead,
        "Retry::Never with 4 attempts left gave {r:?}"
    );
    let r = b
        .fail(
            &jobs[1].lease,
            "last try",
            Retry::After(Duration::from_millis(1)),
        )
        .await?;
    ensure!(r == Settled::Dead, "failing the only attempt gave {r:?}");
    for (id, error) in [(never, "permanent"), (last, "last try")] {
        let info = b.job(&q, id).await?;
        ensure!(
            info.state == JobState::Dead
                && info.last_error.as_deref() == Some(error)
                && info.finished_at.is_some(),
            "job {id}: {} error {:?} finished_at {:?}",
            info.state,
            info.last_error,
            info.finished_at
        );
    }
    claim_nothing(b, &q, "both jobs are dead").await
}

/// SPEC L3: heartbeats keep a lease alive past its first expiry; meanwhile no other
/// claimer gets the job; the heartbeat returns the new expiry.
pub async fn l3_heartbeat_keeps_lease(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l3");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    // Open the second handle first: opening one can be slow on a loaded machine.
    let other = env.connect().await?;
    let job = claim_as(b, &q, "beating", 1, SHORT_LEASE).await?.remove(0);
    let started = Instant::now();
    let mut last = job.lease.expires_at;
    // Simulates a worker busy for 900 ms, three times the lease, heartbeating every 100 ms.
    loop {
        let until = b.heartbeat(&job.lease, Duration::from_secs(1)).await?;
        ensure!(
            until >= last,
            "heartbeat moved the expiry back from {last} to {until}"
        );
        last = until;
        claim_nothing(&*other, &q, "the lease is heartbeated").await?;
        if started.elapsed() >= Duration::from_millis(900) {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        last > job.lease.expires_at,
        "the expiry never moved past {}",
        job.lease.expires_at
    );
    let running = b.running(&q).await?;
    ensure!(
        running.len() == 1
            && running[0].id == id
            && (running[0].lease_expires_at - last).abs() <= TIME_SLACK,
        "running() should show the heartbeated expiry {last}: {running:?}"
    );
    b.complete(&job.lease).await?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.attempts == 1 && info.state == JobState::Succeeded,
        "heartbeated job: {} attempts {}",
        info.state,
        info.attempts
    );
    Ok(())
}

/// SPEC L3: heartbeat of a settled lease is `StaleLease`; an `extend` of zero or over
/// 7 days is `InvalidInput` on `extend`.
pub async fn l3_heartbeat_rejects_stale_and_bad_extend(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l3bad");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    expect_invalid(
        b.heartbeat(&job.lease, Duration::ZERO).await,
        "extend",
        "zero extend",
    )?;
    let long = Duration::from_secs(8 * 24 * 3600);
    expect_invalid(
        b.heartbeat(&job.lease, long).await,
        "extend",
        "8-day extend",
    )?;
    b.complete(&job.lease).await?;
    expect_stale(
        b.heartbeat(&job.lease, LEASE).await,
        "heartbeat after complete",
    )
}

/// SPEC L4, L5: release gives the job back `ready` without counting the attempt; the
/// log shows a released attempt; a second release is `StaleLease`.
pub async fn l4_release_does_not_count(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l4");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).max_attempts(1)).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    b.release(&job.lease).await?;
    expect_stale(b.release(&job.lease).await, "second release")?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.state == JobState::Ready && info.attempts == 0,
        "after release: {} attempts {}",
        info.state,
        info.attempts
    );
    ensure!(
        info.attempt_log.len() == 1 && info.attempt_log[0].outcome == AttemptOutcome::Released,
        "the log should show one released attempt: {:?}",
        info.attempt_log
    );
    let again = claim_exactly(b, &q, &[id]).await?.remove(0);
    ensure!(
        again.attempt() == 1,
        "claim after release has attempt {} (expected 1)",
        again.attempt()
    );
    ensure!(
        again.lease.token != job.lease.token,
        "the token was reused after release"
    );
    b.complete(&again.lease).await?;
    expect_state(b, &q, id, JobState::Succeeded).await
}

/// SPEC L5: every attempt is logged with worker, start, end, outcome and error.
pub async fn l5_attempt_log_records_attempts(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l5log");
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let first = claim_as(b, &q, "worker-a", 1, LEASE).await?.remove(0);
    b.fail(
        &first.lease,
        "boom 1",
        Retry::After(Duration::from_millis(1)),
    )
    .await?;
    let second = poll_claim(b, &q, "worker-b", 1, LEASE, "the retried job")
        .await?
        .remove(0);
    let info = b.job(&q, id).await?;
    let log = &info.attempt_log;
    ensure!(log.len() == 2, "expected 2 attempts logged, got {log:?}");
    ensure!(
        log[1].attempt == 2
            && log[1].worker == "worker-b"
            && log[1].outcome == AttemptOutcome::Running
            && log[1].ended_at.is_none(),
        "the running attempt: {:?}",
        log[1]
    );
    b.complete(&second.lease).await?;
    let info = b.job(&q, id).await?;
    let log = &info.attempt_log;
    let (a, c) = (&log[0], &log[1]);
    ensure!(
        a.attempt == 1
            && a.worker == "worker-a"
            && a.outcome == AttemptOutcome::Failed
            && a.error.as_deref() == Some("boom 1"),
        "first attempt: {a:?}"
    );
    ensure!(
        c.attempt == 2
            && c.worker == "worker-b"
            && c.outcome == AttemptOutcome::Succeeded
            && c.error.is_none(),
        "second attempt: {c:?}"
    );
    let (Some(a_end), Some(c_end)) = (a.ended_at, c.ended_at) else {
        bail!("settled attempts have no end: {log:?}");
    };
    ensure!(
        a.started_at <= a_end && a_end <= c.started_at && c.started_at <= c_end,
        "attempt times out of order: {log:?}"
    );
    ensure!(
        (a.started_at - claimed_at(&first, LEASE)).abs() <= TIME_SLACK,
        "attempt 1 start is not its claim time"
    );
    ensure!(
        info.attempts == 2 && info.finished_at.is_some(),
        "job info: attempts {} finished {:?}",
        info.attempts,
        info.finished_at
    );
    Ok(())
}

/// SPEC L5: `running` lists what runs now: job, worker, attempt, since when.
pub async fn l5_running_lists_holders(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l5run");
    let jobs = enqueue_n(b, &q, 3).await?;
    let a = claim_as(b, &q, "worker-a", 1, LEASE).await?.remove(0);
    let c = claim_as(b, &q, "worker-c", 1, LEASE).await?.remove(0);
    let mut running = b.running(&q).await?;
    running.sort_by_key(|r| r.id);
    ensure!(
        running.len() == 2,
        "running() lists {} jobs, 2 run: {running:?}",
        running.len()
    );
    for (r, job, worker) in [(&running[0], &a, "worker-a"), (&running[1], &c, "worker-c")] {
        ensure!(
            r.id == job.id()
                && r.worker == worker
                && r.attempt == 1
                && (r.lease_expires_at - job.lease.expires_at).abs() <= TIME_SLACK,
            "running entry {r:?} does not match the claim of {} by {worker}",
            job.id()
        );
        ensure!(
            (r.started_at - claimed_at(job, LEASE)).abs() <= TIME_SLACK,
            "running since {} but claimed at {}",
            r.started_at,
            claimed_at(job, LEASE)
        );
    }
    b.complete(&a.lease).await?;
    let left: Vec<_> = b.running(&q).await?.into_iter().map(|r| r.id).collect();
    ensure!(
        left == [c.id()],
        "after one complete running() lists {left:?}"
    );
    ensure!(jobs.len() == 3, "enqueued 3 jobs");
    ensure!(
        b.running(&queue_name("l5none")).await?.is_empty(),
        "an unused queue lists running jobs"
    );
    Ok(())
}

/// `settle_many`'s answers with each error reduced to whether it is `StaleLease`, for
/// matching against the expected pattern.
fn shape(results: &[relayq_core::Result<Settled>]) -> Vec<Result<&Settled, bool>> {
    results
        .iter()
        .map(|r| r.as_ref().map_err(relayq_core::Error::is_stale_lease))
        .collect()
}

/// SPEC L6: `settle_many` judges each lease on its own and answers one result per
/// lease, in input order.
pub async fn l6_settle_many_judges_each_lease(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l6");
    let all = enqueue_n(b, &q, 4).await?;
    let jobs = claim_exactly(b, &q, &all).await?;
    b.complete(&jobs[0].lease).await?;
    let hour = Duration::from_secs(3600);
    let results = b
        .settle_many(vec![
            Settle::complete(jobs[0].lease.clone()),
            Settle::complete(jobs[1].lease.clone()),
            Settle::fail(jobs[2].lease.clone(), "later", Retry::After(hour)),
            Settle::release(jobs[3].lease.clone()),
            Settle::complete(forged(&jobs[1].lease)),
        ])
        .await?;
    ensure!(
        results.len() == 5,
        "5 settles gave {} results",
        results.len()
    );
    let shape = shape(&results);
    ensure!(
        matches!(
            shape.as_slice(),
            [
                Err(true),
                Ok(Settled::Completed),
                Ok(Settled::Retrying { .. }),
                Ok(Settled::Released),
                Err(true)
            ]
        ),
        "settle_many results: {results:?}"
    );
    for (id, want) in all.iter().zip([
        JobState::Succeeded,
        JobState::Succeeded,
        JobState::Retrying,
        JobState::Ready,
    ]) {
        expect_state(b, &q, *id, want).await?;
    }
    let empty = b.settle_many(Vec::new()).await?;
    ensure!(
        empty.is_empty(),
        "settle_many of nothing returned {empty:?}"
    );
    ensure!(
        ids(&claim(b, &q, 10).await?) == [all[3]],
        "only the released job should be claimable"
    );
    Ok(())
}

/// SPEC L1, L5, L6: a call made only of completions (the call a draining worker makes,
/// which a backend may serve on a path of its own) still judges each lease on its
/// own: a lease already settled or forged is `StaleLease` and changes nothing, and
/// each completed attempt is logged with its worker and output.
pub async fn l6_completions_alone_judge_each_lease(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l6done");
    let all = enqueue_n(b, &q, 3).await?;
    let jobs = claim_exactly(b, &q, &all).await?;
    b.complete(&jobs[0].lease).await?;
    let results = b
        .settle_many(vec![
            Settle::complete(jobs[2].lease.clone()),
            Settle::complete(jobs[0].lease.clone()),
            Settle::complete(forged(&jobs[1].lease)),
            Settle::complete(jobs[1].lease.clone()).with_output(Some("out 1".into())),
        ])
        .await?;
    ensure!(
        matches!(
            shape(&results).as_slice(),
            [
                Ok(Settled::Completed),
                Err(true),
                Err(true),
                Ok(Settled::Completed)
            ]
        ),
        "settle_many results: {results:?}"
    );
    for (i, id) in all.iter().enumerate() {
        let info = b.job(&q, *id).await?;
        let log: Vec<_> = info
            .attempt_log
            .iter()
            .map(|a| (a.attempt, a.worker.as_str(), a.output.as_deref()))
            .collect();
        let output = (i == 1).then_some("out 1");
        ensure!(
            info.state == JobState::Succeeded
                && log == [(1, jobs[i].lease.worker.as_str(), output)],
            "job {i}: {} with log {log:?}",
            info.state
        );
    }
    Ok(())
}

/// SPEC L1, L6: a lease given twice in one `settle_many` call is settled by its first
/// entry; the second is judged after it, like a second call, and is `StaleLease`.
pub async fn l6_lease_repeated_in_one_call_settles_once(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l6repeat");
    let all = enqueue_n(b, &q, 3).await?;
    let jobs = claim_exactly(b, &q, &all).await?;
    let hour = Duration::from_secs(3600);
    let results = b
        .settle_many(vec![
            Settle::complete(jobs[0].lease.clone()),
            Settle::complete(jobs[0].lease.clone()),
            Settle::fail(jobs[1].lease.clone(), "later", Retry::After(hour)),
            Settle::complete(jobs[1].lease.clone()),
            Settle::release(jobs[2].lease.clone()),
            Settle::fail(jobs[2].lease.clone(), "gone", Retry::Never),
        ])
        .await?;
    let shape = shape(&results);
    ensure!(
        matches!(
            shape.as_slice(),
            [
                Ok(Settled::Completed),
                Err(true),
                Ok(Settled::Retrying { .. }),
                Err(true),
                Ok(Settled::Released),
                Err(true)
            ]
        ),
        "settle_many results: {results:?}"
    );
    for (id, want) in all
        .iter()
        .zip([JobState::Succeeded, JobState::Retrying, JobState::Ready])
    {
        expect_state(b, &q, *id, want).await?;
    }
    // Each attempt was closed once.
    for id in &all {
        let log = b.job(&q, *id).await?.attempt_log;
        ensure!(
            log.len() == 1,
            "job {id} has {} log entries: {log:?}",
            log.len()
        );
    }
    Ok(())
}

/// SPEC L1, L6: in a call of completions alone (which a backend may serve on a path of
/// its own), a lease given twice is still settled by its first entry, the second is
/// `StaleLease`, and the attempt is logged once.
pub async fn l6_completion_repeated_in_a_call_of_completions(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l6again");
    let all = enqueue_n(b, &q, 2).await?;
    let jobs = claim_exactly(b, &q, &all).await?;
    let results = b
        .settle_many(vec![
            Settle::complete(jobs[1].lease.clone()).with_output(Some("first".into())),
            Settle::complete(jobs[0].lease.clone()),
            Settle::complete(jobs[1].lease.clone()).with_output(Some("second".into())),
        ])
        .await?;
    ensure!(
        matches!(
            shape(&results).as_slice(),
            [Ok(Settled::Completed), Ok(Settled::Completed), Err(true)]
        ),
        "settle_many results: {results:?}"
    );
    for (id, output) in all.iter().zip([None, Some("first")]) {
        let info = b.job(&q, *id).await?;
        let log: Vec<_> = info
            .attempt_log
            .iter()
            .map(|a| a.output.as_deref())
            .collect();
        ensure!(
            info.state == JobState::Succeeded && log == [output],
            "job {id}: {} with log outputs {log:?}",
            info.state
        );
    }
    Ok(())
}

/// SPEC L6: a call of 1000 completions, the most one call may hold (what a draining
/// worker sends when outcomes pile up), settles every lease; the backend's preferred
/// call size, the default of a worker's `settle_batch`, lies within 1..=1000.
pub async fn l6_a_full_call_settles_every_lease(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let preferred = b.preferred_settle_batch();
    ensure!(
        (1..=1000).contains(&preferred),
        "preferred settle batch {preferred} is outside 1..=1000"
    );
    let q = queue_name("l6full");
    let all = enqueue_n(b, &q, 1000).await?;
    let mut jobs = Vec::new();
    while jobs.len() < all.len() {
        let got = claim(b, &q, 1000).await?;
        ensure!(
            !got.is_empty(),
            "claimed {} of 1000 jobs, then nothing",
            jobs.len()
        );
        jobs.extend(got);
    }
    let settles = jobs
        .iter()
        .map(|j| Settle::complete(j.lease.clone()))
        .collect();
    let results = b.settle_many(settles).await?;
    let completed = results
        .iter()
        .filter(|r| matches!(r, Ok(Settled::Completed)))
        .count();
    ensure!(
        results.len() == 1000 && completed == 1000,
        "1000 completions gave {} results, {completed} completed",
        results.len()
    );
    let stats = b.queue_stats(&q).await?;
    ensure!(
        stats.count(JobState::Succeeded) == 1000,
        "after 1000 completions: {:?}",
        stats.counts
    );
    Ok(())
}

/// SPEC L6, X3: a settle call rejected as a whole (more than 1000 leases, a bad retry
/// time) settles nothing: every lease still holds.
pub async fn l6_rejected_settle_call_settles_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l6bad");
    let all = enqueue_n(b, &q, 2).await?;
    let jobs = claim_exactly(b, &q, &all).await?;
    let far = Duration::from_secs(200 * 365 * 24 * 3600);
    let bad = vec![
        Settle::complete(jobs[0].lease.clone()),
        Settle::fail(jobs[1].lease.clone(), "x", Retry::After(far)),
    ];
    expect_invalid(b.settle_many(bad).await, "retry", "a retry 200 years away")?;
    let many = (0..1001)
        .map(|_| Settle::complete(jobs[0].lease.clone()))
        .collect();
    expect_invalid(b.settle_many(many).await, "settles", "1001 settles")?;
    for job in &jobs {
        expect_state(b, &q, job.id(), JobState::Running).await?;
    }
    claim_nothing(&*env.connect().await?, &q, "both leases still hold").await?;
    for job in &jobs {
        b.complete(&job.lease).await?;
    }
    Ok(())
}

/// SPEC L5: a settle that says how long the job waited in its worker before its
/// handler started logs the attempt as starting that much after its claim, for every
/// outcome and kind of job (plain, grouped, in a batch), and never after its end,
/// keeping the claim time beside it; a settle that says nothing keeps the claim time;
/// a wait over 100 years is `InvalidInput` on `waited`.
pub async fn l5_a_wait_in_the_worker_moves_the_logged_start(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l5wait");
    let batch = b.open_batch(&q, relayq_core::OnFailure::Continue).await?;
    let jobs = vec![
        NewJob::new(&q, b"plain".to_vec()),
        NewJob::new(&q, b"grouped".to_vec()).group("g"),
        NewJob::new(&q, b"batched".to_vec()).in_batch(batch.id, 1),
        NewJob::new(&q, b"fails".to_vec()).max_attempts(1),
        NewJob::new(&q, b"released".to_vec()),
        NewJob::new(&q, b"overlong".to_vec()),
        NewJob::new(&q, b"silent".to_vec()),
    ];
    let ids = b
        .enqueue(jobs)
        .await?
        .iter()
        .map(|e| e.id)
        .collect::<Vec<_>>();
    let got = claim_exactly(b, &q, &ids).await?;
    let mut claimed = Vec::new();
    for id in &ids {
        let running = b.job(&q, *id).await?.attempt_log.remove(0);
        ensure!(
            running.claimed_at == Some(running.started_at),
            "job {id}: a running attempt is claimed when it starts: {running:?}"
        );
        claimed.push(running.started_at);
    }
    // The attempts must last longer than the wait they report: time has to pass
    // between the claim and the settle, it is not waiting for something to happen.
    let wait = Duration::from_millis(100);
    sleep(wait + Duration::from_millis(50)).await;
    // A wait no date holds is refused, naming it, and settles nothing.
    expect_invalid(
        b.settle_many(vec![
            Settle::complete(got[0].lease.clone()).with_waited(Duration::MAX),
        ])
        .await,
        "waited",
        "a wait past every date",
    )?;
    expect_state(b, &q, ids[0], JobState::Running).await?;
    let settles = vec![
        Settle::complete(got[0].lease.clone()).with_waited(wait),
        Settle::complete(got[1].lease.clone()).with_waited(wait),
        Settle::complete(got[2].lease.clone()).with_waited(wait),
        Settle::fail(got[3].lease.clone(), "no", Retry::Never).with_waited(wait),
        Settle::release(got[4].lease.clone()).with_waited(wait),
        Settle::complete(got[5].lease.clone()).with_waited(Duration::from_secs(86_400)),
        Settle::complete(got[6].lease.clone()),
    ];
    for r in b.settle_many(settles).await? {
        r?;
    }
    for (i, id) in ids.iter().enumerate() {
        let log = b.job(&q, *id).await?.attempt_log;
        let a = &log[0];
        let end = a
            .ended_at
            .ok_or_else(|| anyhow::anyhow!("job {id}: no end"))?;
        ensure!(
            a.started_at <= end,
            "job {id}: started {} after its end {end}",
            a.started_at
        );
        // The claim is kept as it was, whatever the start (SPEC L5).
        ensure!(
            a.claimed_at == Some(claimed[i]),
            "job {id}: logged claim {:?}, claimed at {}",
            a.claimed_at,
            claimed[i]
        );
        let moved = a.started_at - claimed[i];
        match i {
            5 => ensure!(
                end - a.started_at <= TIME_SLACK,
                "job {id}: a wait past the end should start it at its end: {a:?}"
            ),
            6 => ensure!(
                moved.abs() <= TIME_SLACK,
                "job {id}: no wait given, yet the start moved by {moved}"
            ),
            _ => ensure!(
                (moved - delta(wait)).abs() <= TIME_SLACK,
                "job {id} ({:?}): the start moved by {moved}, expected {wait:?}",
                a.outcome
            ),
        }
    }
    Ok(())
}
