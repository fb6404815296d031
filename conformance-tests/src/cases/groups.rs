//! SPEC G — groups: mutual exclusion, in order.

use std::time::Duration;

use anyhow::ensure;
use relayq_core::{CompleteExt, JobState, NewJob, OnFailure, Retry, Settled};

use super::support::{
    LEASE, claim, claim_exactly, claim_nothing, enqueue_all, expect_state, ids, poll_claim,
};
use crate::{Env, queue_name};

/// SPEC G1, G3, C3: a claim takes only the head of each group, skips the jobs behind
/// it, and fills its limit from other groups and ungrouped jobs, in order-key order.
pub async fn g3_claim_fills_limit_past_blocked_jobs(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g3");
    let job = |g: Option<&str>| {
        let j = NewJob::new(&q, b"x".to_vec());
        match g {
            Some(g) => j.group(g),
            None => j,
        }
    };
    let [a1, a2, a3, b1, b2, u1, u2] = enqueue_all(
        b,
        vec![
            job(Some("a")),
            job(Some("a")),
            job(Some("a")),
            job(Some("b")),
            job(Some("b")),
            job(None),
            job(None),
        ],
    )
    .await?[..] else {
        anyhow::bail!("expected 7 ids");
    };
    let got = claim(b, &q, 4).await?;
    ensure!(
        ids(&got) == [a1, b1, u1, u2],
        "a claim of 4 should take the group heads and the ungrouped jobs [{a1}, {b1}, {u1}, {u2}], got {:?}",
        ids(&got)
    );
    for id in [a2, a3, b2] {
        expect_state(b, &q, id, JobState::Blocked).await?;
    }
    claim_nothing(b, &q, "every group is held").await?;
    b.complete(&got[0].lease).await?;
    claim_exactly(b, &q, &[a2]).await?;
    Ok(())
}

/// SPEC G1, G2: a retrying job keeps holding its group and its place: nothing of its
/// group overtakes it, and it runs again before the next job of the group.
pub async fn g2_retrying_job_is_not_overtaken(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g2retry");
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"1".to_vec()).group("g"),
            NewJob::new(&q, b"2".to_vec()).group("g"),
            NewJob::new(&q, b"u".to_vec()),
        ],
    )
    .await?;
    let (first, second, free) = (all[0], all[1], all[2]);
    let got = claim_exactly(b, &q, &[first, free]).await?;
    let r = b
        .fail(
            &got[0].lease,
            "again",
            Retry::After(Duration::from_millis(400)),
        )
        .await?;
    ensure!(
        matches!(r, Settled::Retrying { .. }),
        "fail with attempts left gave {r:?}"
    );
    claim_nothing(b, &q, "the group's head is retrying").await?;
    expect_state(b, &q, second, JobState::Blocked).await?;
    let again = poll_claim(b, &q, "w", 10, LEASE, "the retrying job").await?;
    ensure!(
        ids(&again) == [first] && again[0].attempt() == 2,
        "after the backoff the claim should return only {first} (attempt 2), got {:?}",
        ids(&again)
    );
    b.complete(&again[0].lease).await?;
    claim_exactly(b, &q, &[second]).await?;
    Ok(())
}

/// SPEC G2, L4: a released job keeps its place at the head of its group.
pub async fn g2_released_job_keeps_its_place(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g2release");
    let both = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"1".to_vec()).group("g"),
            NewJob::new(&q, b"2".to_vec()).group("g"),
        ],
    )
    .await?;
    let got = claim_exactly(b, &q, &both[..1]).await?;
    b.release(&got[0].lease).await?;
    let again = claim_exactly(b, &q, &both[..1]).await?;
    b.complete(&again[0].lease).await?;
    claim_exactly(b, &q, &both[1..]).await?;
    Ok(())
}

/// SPEC G2, L4: a retried job that is released (a worker's prefetch buffer gives it
/// back unrun) keeps its place: its backoff moved its `run_at` past later jobs of its
/// group, yet none of them starts before it. It goes back to `retrying`, as before the
/// claim. (Found by the torture run: a later job of a group ran before a retrying one.)
pub async fn g2_released_retry_keeps_its_place(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g2rretry");
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"1".to_vec()).group("g"),
            NewJob::new(&q, b"2".to_vec()).group("g"),
        ],
    )
    .await?;
    let (first, second) = (all[0], all[1]);
    let got = claim_exactly(b, &q, &[first]).await?;
    b.fail(
        &got[0].lease,
        "again",
        Retry::After(Duration::from_millis(200)),
    )
    .await?;
    let again = poll_claim(b, &q, "w", 10, LEASE, "the retrying job").await?;
    ensure!(
        ids(&again) == [first],
        "the retry should come first, got {:?}",
        ids(&again)
    );
    b.release(&again[0].lease).await?;
    expect_state(b, &q, first, JobState::Retrying).await?;
    expect_state(b, &q, second, JobState::Blocked).await?;
    let third = claim(b, &q, 10).await?;
    ensure!(
        ids(&third) == [first] && third[0].attempt() == 2,
        "after the release the claim should return only {first} (attempt 2 again), got {:?}",
        ids(&third)
    );
    b.complete(&third[0].lease).await?;
    claim_exactly(b, &q, &[second]).await?;
    Ok(())
}

/// SPEC G2: order within a group is by order key, not enqueue order: a later job of
/// lower priority value runs first, and jobs of a group start one after another.
pub async fn g2_group_runs_in_order_key_order(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g2order");
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"a".to_vec()).group("g"),
            NewJob::new(&q, b"b".to_vec()).group("g").priority(-1),
            NewJob::new(&q, b"c".to_vec()).group("g"),
        ],
    )
    .await?;
    for id in [all[1], all[0], all[2]] {
        let got = claim_exactly(b, &q, &[id]).await?;
        b.complete(&got[0].lease).await?;
    }
    Ok(())
}

/// SPEC G4, G1: a group job waiting for its stage does not hold its group: a later job
/// of the group outside the batch runs meanwhile, and the staged job runs after it.
pub async fn g4_stage_wait_does_not_hold_group(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g4");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"s100".to_vec()).in_batch(batch.id, 100),
            NewJob::new(&q, b"g200".to_vec())
                .in_batch(batch.id, 200)
                .group("g"),
        ],
    )
    .await?;
    let (s100, g200) = (all[0], all[1]);
    let plain = enqueue_all(b, vec![NewJob::new(&q, b"plain".to_vec()).group("g")]).await?[0];
    let got = claim(b, &q, 10).await?;
    ensure!(
        ids(&got) == [s100, plain],
        "expected the stage-100 job and the group's non-batch job [{s100}, {plain}], got {:?}",
        ids(&got)
    );
    expect_state(b, &q, g200, JobState::Blocked).await?;
    b.complete(&got[0].lease).await?;
    claim_nothing(
        b,
        &q,
        "stage 200 is released but group g is held by the plain job",
    )
    .await?;
    b.complete(&got[1].lease).await?;
    claim_exactly(b, &q, &[g200]).await?;
    Ok(())
}

/// SPEC G2, E2: jobs of the group due in the far future (year 2300, and the latest time
/// a job may have, in year 9999) come after a job due now, even when enqueued first in
/// the same call, and keep their times exactly.
pub async fn g2_far_future_job_waits_behind_due_ones(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g2far");
    let at = |year| {
        chrono::TimeZone::with_ymd_and_hms(&chrono::Utc, year, 12, 30, 0, 0, 0)
            .single()
            .expect("a valid time")
    };
    let (far, farthest) = (at(2300), at(9999));
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"far".to_vec()).group("g").run_at(far),
            NewJob::new(&q, b"farthest".to_vec())
                .group("g")
                .run_at(farthest),
            NewJob::new(&q, b"now".to_vec()).group("g"),
        ],
    )
    .await?;
    claim_exactly(b, &q, &all[2..]).await?;
    for (id, when) in [(all[0], far), (all[1], farthest)] {
        let info = b.job(&q, id).await?;
        ensure!(
            info.run_at == when,
            "run_at {when} came back as {}",
            info.run_at
        );
        ensure!(
            info.state == JobState::Scheduled || info.state == JobState::Blocked,
            "the job due {when} is {:?}",
            info.state
        );
    }
    Ok(())
}
