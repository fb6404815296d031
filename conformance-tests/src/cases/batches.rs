//! SPEC B — batches and ordered stages (the order barrier).

use std::time::Duration;

use anyhow::ensure;
use chrono::{TimeDelta, Utc};
use relayq_core::{
    Batch, BatchId, BatchProgress, CompleteExt, EnqueueExt, Error, JobState, NewJob, OnFailure,
    OrderBarrierExt, Retry, Settled, StageProgress, WaitFor,
};
use tokio::time::Instant;

use super::support::{
    LEASE, claim, claim_exactly, claim_nothing, complete_all, enqueue, enqueue_all, enqueue_n,
    expect_invalid, expect_not_found, expect_stale, expect_state, ids, total,
};
use crate::{Env, queue_name};

/// Enqueues one job per entry of `stages` into `batch`; returns their ids.
async fn staged(
    env: &Env,
    batch: &Batch,
    stages: &[i32],
) -> anyhow::Result<Vec<relayq_core::JobId>> {
    let jobs = stages
        .iter()
        .map(|s| NewJob::new(&batch.queue, s.to_string().into_bytes()).in_batch(batch.id, *s))
        .collect();
    enqueue_all(env.backend(), jobs).await
}

/// The counts of `stage` in `p`, or all zero.
fn counts(p: &BatchProgress, stage: i32) -> StageProgress {
    p.stages
        .iter()
        .find(|s| s.stage == stage)
        .copied()
        .unwrap_or(StageProgress {
            stage,
            ..Default::default()
        })
}

/// Checks `(pending, running, succeeded, dead, cancelled)` of `stage`.
fn expect_counts(
    p: &BatchProgress,
    stage: i32,
    want: (u64, u64, u64, u64, u64),
) -> anyhow::Result<()> {
    let c = counts(p, stage);
    let got = (c.pending, c.running, c.succeeded, c.dead, c.cancelled);
    ensure!(
        got == want,
        "stage {stage} (pending, running, succeeded, dead, cancelled) = {got:?}, expected {want:?}"
    );
    Ok(())
}

/// SPEC B1: `open_batch` returns a new, empty, unsealed batch of its queue.
pub async fn b1_open_batch_is_empty(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b1");
    let one = b.open_batch(&q, OnFailure::Halt).await?;
    let two = b.open_batch(&q, OnFailure::Continue).await?;
    ensure!(
        one.queue == q && two.queue == q,
        "batches name the wrong queue"
    );
    ensure!(one.id != two.id, "two batches got the same id {}", one.id);
    let p = b.batch_progress(&one).await?;
    ensure!(
        !p.sealed
            && !p.failed
            && p.stages.is_empty()
            && p.on_failure == OnFailure::Halt
            && p.released_stage.is_none(),
        "a new batch: {p:?}"
    );
    ensure!(
        b.batch_progress(&two).await?.on_failure == OnFailure::Continue,
        "on_failure not kept"
    );
    expect_invalid(
        b.open_batch("no spaces", OnFailure::Halt).await,
        "queue",
        "open_batch with a bad queue",
    )
}

/// SPEC B2: a later stage waits until every job of the earlier stages is finished;
/// the jobs of one stage are claimable together.
pub async fn b2_later_stage_waits(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b2");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = staged(env, &batch, &[2, 1, 1]).await?;
    let first = claim_exactly(b, &q, &all[1..]).await?;
    expect_state(b, &q, all[0], JobState::Blocked).await?;
    b.complete(&first[0].lease).await?;
    claim_nothing(b, &q, "one stage-1 job still runs").await?;
    b.complete(&first[1].lease).await?;
    claim_exactly(b, &q, &all[..1]).await?;
    Ok(())
}

/// SPEC B3: a stage may be added, and the current stage extended, while an earlier
/// stage runs; the new stage runs after it.
pub async fn b3_stage_added_while_running(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b3add");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let a = staged(env, &batch, &[1]).await?[0];
    let running = claim_exactly(b, &q, &[a]).await?;
    let later = staged(env, &batch, &[2]).await?[0];
    let same = staged(env, &batch, &[1]).await?[0];
    let more = claim_exactly(b, &q, &[same]).await?;
    b.complete(&running[0].lease).await?;
    claim_nothing(b, &q, "the added stage-1 job still runs").await?;
    b.complete(&more[0].lease).await?;
    claim_exactly(b, &q, &[later]).await?;
    Ok(())
}

/// SPEC B3, E1: adding below the highest released stage is `StageClosed` and stores
/// nothing of the call; the released stage moves up as stages finish; the current
/// stage and later ones stay open.
pub async fn b3_lower_stage_is_closed(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b3closed");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let ten = staged(env, &batch, &[10]).await?[0];
    let res = b
        .enqueue(vec![
            NewJob::new(&q, b"ok".to_vec()).in_batch(batch.id, 10),
            NewJob::new(&q, b"low".to_vec()).in_batch(batch.id, 5),
        ])
        .await;
    ensure!(
        matches!(
            res,
            Err(Error::StageClosed {
                stage: 5,
                released: 10
            })
        ),
        "stage 5 after stage 10 was released: expected StageClosed {{ stage: 5, released: 10 }}, got {res:?}"
    );
    ensure!(total(b, &q).await? == 1, "the rejected call stored jobs");
    let twenty = staged(env, &batch, &[20]).await?[0];
    let running = claim_exactly(b, &q, &[ten]).await?;
    let p = b.batch_progress(&batch).await?;
    ensure!(
        p.released_stage == Some(10),
        "released stage while 10 runs: {:?}",
        p.released_stage
    );
    b.complete(&running[0].lease).await?;
    let p = b.batch_progress(&batch).await?;
    ensure!(
        p.released_stage == Some(20),
        "released stage after 10 finished: {:?}",
        p.released_stage
    );
    let res = b
        .enqueue_one(NewJob::new(&q, b"15".to_vec()).in_batch(batch.id, 15))
        .await;
    ensure!(
        matches!(
            res,
            Err(Error::StageClosed {
                stage: 15,
                released: 20
            })
        ),
        "stage 15 after stage 20 was released: expected StageClosed {{ stage: 15, released: 20 }}, got {res:?}"
    );
    let added = staged(env, &batch, &[20, 30]).await?;
    claim_exactly(b, &q, &[twenty, added[0]]).await?;
    Ok(())
}

/// SPEC B3, B4, E4: enqueue into a sealed batch is `InvalidInput` on `batch` and
/// stores nothing; sealing twice is fine.
pub async fn b4_sealed_batch_takes_no_jobs(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b4sealed");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    staged(env, &batch, &[1]).await?;
    b.seal(&batch).await?;
    b.seal(&batch).await?;
    ensure!(
        b.batch_progress(&batch).await?.sealed,
        "progress does not show the batch sealed"
    );
    let res = b
        .enqueue(vec![
            NewJob::new(&q, b"plain".to_vec()),
            NewJob::new(&q, b"late".to_vec()).in_batch(batch.id, 1),
        ])
        .await;
    expect_invalid(res, "batch", "enqueue into a sealed batch")?;
    ensure!(total(b, &q).await? == 1, "the rejected call stored jobs");
    Ok(())
}

/// SPEC E4, B4, M1: an unknown batch is `InvalidInput` on `batch` for enqueue and
/// `NotFound` for seal and progress.
pub async fn e4_unknown_batch_is_rejected(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e4batch");
    b.open_batch(&q, OnFailure::Continue).await?;
    let ghost = Batch {
        queue: q.clone(),
        id: BatchId(i64::MAX - 7),
    };
    let res = b
        .enqueue(vec![
            NewJob::new(&q, b"x".to_vec()),
            NewJob::new(&q, b"y".to_vec()).in_batch(ghost.id, 1),
        ])
        .await;
    expect_invalid(res, "batch", "enqueue into an unknown batch")?;
    ensure!(total(b, &q).await? == 0, "the rejected call stored jobs");
    expect_not_found(b.seal(&ghost).await, "seal of an unknown batch")?;
    expect_not_found(
        b.batch_progress(&ghost).await,
        "progress of an unknown batch",
    )
}

/// SPEC B4, B5: the whole batch is reached only once it is sealed and all its jobs are
/// finished.
pub async fn b4_batch_completes_only_when_sealed(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b4done");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = staged(env, &batch, &[1, 2]).await?;
    complete_all(b, &q, &all[..1]).await?;
    complete_all(b, &q, &all[1..]).await?;
    let short = Duration::from_millis(300);
    let res = b.wait(&batch, WaitFor::Batch, short).await;
    ensure!(
        matches!(res, Err(Error::Timeout { .. })),
        "wait on an unsealed batch: expected Timeout, got {res:?}"
    );
    let p = b.wait(&batch, WaitFor::Stage(2), short).await?;
    ensure!(
        p.stage_finished(2) && !p.sealed,
        "stage wait on the unsealed batch: {p:?}"
    );
    b.seal(&batch).await?;
    let p = b
        .wait(&batch, WaitFor::Batch, Duration::from_secs(10))
        .await?;
    ensure!(p.is_finished(), "wait returned an unfinished batch: {p:?}");
    expect_counts(&p, 1, (0, 0, 1, 0, 0))?;
    expect_counts(&p, 2, (0, 0, 1, 0, 0))
}

/// SPEC B5, M1: `wait` for a stage returns once it and every lower stage is finished,
/// with counts per stage; `wait` for the sealed batch likewise.
pub async fn b5_wait_returns_counts(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b5");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = staged(env, &batch, &[1, 1, 1, 2, 2]).await?;
    let shared = env.shared();
    let (bt, long) = (batch.clone(), Duration::from_secs(20));
    let stage_wait = tokio::spawn(async move { shared.wait(&bt, WaitFor::Stage(1), long).await });
    let first = claim_exactly(b, &q, &all[..3]).await?;
    b.complete(&first[0].lease).await?;
    b.fail(&first[1].lease, "fatal", Retry::Never).await?;
    ensure!(
        b.cancel_job(&q, all[2]).await?,
        "cancel of a running job returned false"
    );
    let p = stage_wait.await??;
    ensure!(
        p.stage_finished(1),
        "stage wait returned before stage 1 finished: {p:?}"
    );
    expect_counts(&p, 1, (0, 0, 1, 1, 1))?;
    expect_counts(&p, 2, (2, 0, 0, 0, 0))?;
    let shared = env.shared();
    let bt = batch.clone();
    let batch_wait = tokio::spawn(async move { shared.wait(&bt, WaitFor::Batch, long).await });
    let second = claim_exactly(b, &q, &all[3..]).await?;
    b.complete(&second[0].lease).await?;
    expect_counts(&b.batch_progress(&batch).await?, 2, (0, 1, 1, 0, 0))?;
    b.complete(&second[1].lease).await?;
    b.seal(&batch).await?;
    let p = batch_wait.await??;
    ensure!(
        p.is_finished() && p.sealed,
        "batch wait returned before the sealed batch finished: {p:?}"
    );
    expect_counts(&p, 1, (0, 0, 1, 1, 1))?;
    expect_counts(&p, 2, (0, 0, 2, 0, 0))?;
    ensure!(!p.failed, "a Continue batch reports failed");
    Ok(())
}

/// Checks `reached` for each `(target, want)`, and that `batch_progress` agrees.
async fn expect_reached(
    b: &dyn relayq_core::Backend,
    batch: &Batch,
    step: &str,
    want: &[(WaitFor, bool)],
) -> anyhow::Result<()> {
    for &(target, want) in want {
        let got = b.reached(batch, target).await?;
        ensure!(
            got == want,
            "{step}: reached({target:?}) = {got}, expected {want}"
        );
        let p = b.batch_progress(batch).await?;
        ensure!(
            p.reached(target) == want,
            "{step}: batch_progress disagrees with reached({target:?}) = {want}: {p:?}"
        );
    }
    Ok(())
}

/// SPEC B4, B5: `reached` says whether a stage, with every stage below it, or the
/// sealed batch is finished: pending, running and retrying jobs hold it; succeeded,
/// dead and cancelled ones do not. It agrees with `batch_progress` at every step.
pub async fn b5_reached_follows_the_batch(env: &Env) -> anyhow::Result<()> {
    use WaitFor::{Batch as Whole, Stage};
    let b = env.backend();
    let q = queue_name("b5reached");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    expect_reached(b, &batch, "empty", &[(Stage(1), true), (Whole, false)]).await?;
    let all = staged(env, &batch, &[1, 1, 2, 3]).await?;
    let pending = [(Stage(0), true), (Stage(1), false), (Stage(3), false)];
    expect_reached(b, &batch, "enqueued", &pending).await?;
    let first = claim_exactly(b, &q, &all[..2]).await?;
    expect_reached(b, &batch, "running", &[(Stage(1), false)]).await?;
    b.complete(&first[0].lease).await?;
    let later = Retry::After(Duration::from_secs(3600));
    b.fail(&first[1].lease, "again later", later).await?;
    expect_state(b, &q, all[1], JobState::Retrying).await?;
    expect_reached(b, &batch, "retrying", &[(Stage(1), false)]).await?;
    ensure!(b.cancel_job(&q, all[1]).await?, "cancel of a retrying job");
    let one_done = [
        (Stage(1), true),
        (Stage(2), false),
        (Stage(i32::MAX), false),
    ];
    expect_reached(b, &batch, "stage 1 done", &one_done).await?;
    let second = claim_exactly(b, &q, &all[2..3]).await?;
    b.fail(&second[0].lease, "fatal", Retry::Never).await?;
    let two_done = [(Stage(2), true), (Stage(3), false), (Whole, false)];
    expect_reached(b, &batch, "stage 2 dead", &two_done).await?;
    complete_all(b, &q, &all[3..]).await?;
    let unsealed = [(Stage(3), true), (Stage(i32::MAX), true), (Whole, false)];
    expect_reached(b, &batch, "all done, unsealed", &unsealed).await?;
    b.seal(&batch).await?;
    expect_reached(b, &batch, "sealed", &[(Whole, true)]).await?;
    let elsewhere = Batch {
        queue: queue_name("b5reached"),
        id: batch.id,
    };
    expect_not_found(b.reached(&elsewhere, Whole).await, "reached, another queue")?;
    let ghost = Batch {
        id: BatchId(i64::MAX),
        ..batch
    };
    expect_not_found(b.reached(&ghost, Stage(1)).await, "reached, unknown batch")
}

/// SPEC B4, B5, G1: a batch job blocked behind its group's holder still holds its stage
/// for `reached`, and so does any unfinished job of a sealed batch; stages go down to
/// `i32::MIN`.
pub async fn b5_reached_counts_blocked_jobs(env: &Env) -> anyhow::Result<()> {
    use WaitFor::{Batch as Whole, Stage};
    let b = env.backend();
    let q = queue_name("b5blocked");
    let holder = enqueue(b, NewJob::new(&q, b"holder".to_vec()).group("g")).await?;
    let held = claim_exactly(b, &q, &[holder]).await?;
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let low = NewJob::new(&q, b"low".to_vec())
        .in_batch(batch.id, i32::MIN)
        .group("g");
    let job = enqueue(b, low).await?;
    b.seal(&batch).await?;
    expect_state(b, &q, job, JobState::Blocked).await?;
    let blocked = [(Stage(i32::MIN), false), (Stage(0), false), (Whole, false)];
    expect_reached(b, &batch, "sealed, blocked behind its group", &blocked).await?;
    b.complete(&held[0].lease).await?;
    complete_all(b, &q, &[job]).await?;
    let done = [(Stage(i32::MIN), true), (Whole, true)];
    expect_reached(b, &batch, "sealed, finished", &done).await
}

/// SPEC B5: `wait` that is not reached in time is `Timeout`, after about the timeout.
pub async fn b5_wait_times_out(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b5timeout");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    staged(env, &batch, &[1]).await?;
    let started = Instant::now();
    let res = b
        .wait(&batch, WaitFor::Stage(1), Duration::from_millis(300))
        .await;
    let took = started.elapsed();
    ensure!(
        matches!(res, Err(Error::Timeout { .. })),
        "wait for an unfinished stage: expected Timeout, got {res:?}"
    );
    ensure!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "a 300 ms wait took {took:?}"
    );
    Ok(())
}

/// SPEC B6, B8: in a `Halt` batch a retrying job does not halt it; once a job is dead
/// the batch reports failed and every other unfinished job is cancelled: later stages,
/// and the same stage's, running ones included (a late completion is stale, the
/// attempt logged as cancelled); the batch takes no more jobs.
pub async fn b6_halt_cancels_later_stages(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b6halt");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let jobs = vec![
        // Priority -1: its retry comes back before the not-started job x of its stage.
        NewJob::new(&q, b"a".to_vec())
            .in_batch(batch.id, 1)
            .max_attempts(2)
            .priority(-1),
        NewJob::new(&q, b"b".to_vec()).in_batch(batch.id, 1),
        NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, 1),
        NewJob::new(&q, b"c".to_vec()).in_batch(batch.id, 2),
        NewJob::new(&q, b"d".to_vec()).in_batch(batch.id, 2),
        NewJob::new(&q, b"e".to_vec()).in_batch(batch.id, 3),
    ];
    let all = enqueue_all(b, jobs).await?;
    let (a, bb, x) = (all[0], all[1], all[2]);
    let got = claim(b, &q, 2).await?;
    ensure!(
        ids(&got) == [a, bb],
        "expected to claim [{a}, {bb}], got {:?}",
        ids(&got)
    );
    // A retry time in the past: due at once.
    let past = Utc::now() - TimeDelta::hours(1);
    b.fail(&got[0].lease, "once", Retry::At(past)).await?;
    let p = b.batch_progress(&batch).await?;
    ensure!(!p.failed, "a retrying job halted the batch: {p:?}");
    let again = claim(b, &q, 1).await?;
    ensure!(
        ids(&again) == [a],
        "expected the retry of {a}, got {:?}",
        ids(&again)
    );
    let r = b
        .fail(
            &again[0].lease,
            "twice",
            Retry::After(Duration::from_millis(1)),
        )
        .await?;
    ensure!(r == Settled::Dead, "failing the last attempt gave {r:?}");
    let p = b.batch_progress(&batch).await?;
    ensure!(
        p.failed,
        "the Halt batch does not report failed after a dead job"
    );
    expect_counts(&p, 1, (0, 0, 0, 1, 2))?;
    expect_counts(&p, 2, (0, 0, 0, 0, 2))?;
    expect_counts(&p, 3, (0, 0, 0, 0, 1))?;
    for id in &all[1..] {
        expect_state(b, &q, *id, JobState::Cancelled).await?;
    }
    expect_stale(
        b.complete(&got[1].lease).await,
        "completing a running job the halt cancelled",
    )?;
    let log = b.job(&q, bb).await?.attempt_log;
    ensure!(
        log.len() == 1 && log[0].outcome == relayq_core::AttemptOutcome::Cancelled,
        "the halted running job's attempt should be logged as cancelled: {log:?}"
    );
    ensure!(
        b.job(&q, x).await?.attempt_log.is_empty(),
        "{x} never started"
    );
    claim_nothing(b, &q, "a halted batch").await?;
    let res = b
        .enqueue_one(NewJob::new(&q, b"late".to_vec()).in_batch(batch.id, 4))
        .await;
    expect_invalid(res, "batch", "enqueue into a halted batch")
}

/// SPEC B6: when the dead job was the last of its stage, a `Halt` batch opens no later
/// stage: they are cancelled, nothing is claimable, and the released stage stays the
/// dead job's.
pub async fn b6_halt_opens_no_later_stage(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b6last");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let all = staged(env, &batch, &[1, 2, 2, 3]).await?;
    let first = claim_exactly(b, &q, &all[..1]).await?;
    b.fail(&first[0].lease, "fatal", Retry::Never).await?;
    claim_nothing(b, &q, "a halted batch's later stages").await?;
    let p = b.batch_progress(&batch).await?;
    ensure!(p.failed, "the batch does not report failed: {p:?}");
    ensure!(
        p.released_stage == Some(1),
        "the released stage moved to {:?} after the halt",
        p.released_stage
    );
    expect_counts(&p, 2, (0, 0, 0, 0, 2))?;
    expect_counts(&p, 3, (0, 0, 0, 0, 1))
}

/// SPEC B6: in a `Continue` batch a dead job counts as finished: later stages run and
/// the batch does not report failed.
pub async fn b6_continue_runs_later_stages(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b6cont");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = staged(env, &batch, &[1, 2]).await?;
    let first = claim_exactly(b, &q, &all[..1]).await?;
    b.fail(&first[0].lease, "fatal", Retry::Never).await?;
    complete_all(b, &q, &all[1..]).await?;
    b.seal(&batch).await?;
    let p = b
        .wait(&batch, WaitFor::Batch, Duration::from_secs(10))
        .await?;
    ensure!(!p.failed, "a Continue batch reports failed");
    expect_counts(&p, 1, (0, 0, 0, 1, 0))?;
    expect_counts(&p, 2, (0, 0, 1, 0, 0))
}

/// SPEC B7, L5: `cancel_job` cancels a job not started, retrying or running (whose
/// lease is revoked); a finished job answers false; an unknown job is `NotFound`.
pub async fn b7_cancel_job(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b7job");
    let all = enqueue_n(b, &q, 4).await?;
    let got = claim_exactly(b, &q, &all).await?;
    let (running, done, retrying) = (&got[0], &got[1], &got[2]);
    b.complete(&done.lease).await?;
    b.fail(
        &retrying.lease,
        "later",
        Retry::After(Duration::from_secs(3600)),
    )
    .await?;
    b.release(&got[3].lease).await?;
    for (id, what) in [(all[0], "running"), (all[2], "retrying"), (all[3], "ready")] {
        ensure!(
            b.cancel_job(&q, id).await?,
            "cancel of a {what} job returned false"
        );
        expect_state(b, &q, id, JobState::Cancelled).await?;
    }
    expect_stale(b.complete(&running.lease).await, "complete after cancel")?;
    expect_stale(
        b.heartbeat(&running.lease, LEASE).await,
        "heartbeat after cancel",
    )?;
    ensure!(
        b.running(&q).await?.is_empty(),
        "running() lists a cancelled job"
    );
    let log = b.job(&q, all[0]).await?.attempt_log;
    ensure!(
        log.last().is_some_and(
            |r| r.outcome == relayq_core::AttemptOutcome::Cancelled && r.ended_at.is_some()
        ),
        "the cancelled attempt is not closed as cancelled: {log:?}"
    );
    ensure!(
        !b.cancel_job(&q, all[1]).await?,
        "cancel of a succeeded job returned true"
    );
    ensure!(
        !b.cancel_job(&q, all[0]).await?,
        "second cancel returned true"
    );
    expect_state(b, &q, all[1], JobState::Succeeded).await?;
    expect_not_found(
        b.cancel_job(&q, relayq_core::JobId(i64::MAX - 7)).await,
        "cancel of an unknown job",
    )?;
    claim_nothing(b, &q, "every job is finished").await
}

/// SPEC B7, B2, G2: cancelling a job releases what waited for it: the next stage and
/// the next job of its group.
pub async fn b7_cancel_releases_waiting_jobs(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b7release");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"s1".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"s2".to_vec()).in_batch(batch.id, 2),
            NewJob::new(&q, b"g1".to_vec()).group("g"),
            NewJob::new(&q, b"g2".to_vec()).group("g"),
        ],
    )
    .await?;
    claim_exactly(b, &q, &[all[0], all[2]]).await?;
    ensure!(
        b.cancel_job(&q, all[0]).await?,
        "cancel of the running stage-1 job returned false"
    );
    ensure!(
        b.cancel_job(&q, all[2]).await?,
        "cancel of the running group head returned false"
    );
    let p = b.batch_progress(&batch).await?;
    ensure!(!p.failed, "a cancelled job halted the batch");
    claim_exactly(b, &q, &[all[1], all[3]]).await?;
    Ok(())
}

/// SPEC B7: `cancel_batch` cancels every unfinished job (running ones lose their
/// lease), leaves finished ones, seals the batch, and answers how many it cancelled.
pub async fn b7_cancel_batch(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b7batch");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = staged(env, &batch, &[1, 1, 2]).await?;
    let got = claim_exactly(b, &q, &all[..2]).await?;
    b.complete(&got[1].lease).await?;
    let n = b.cancel_batch(&batch).await?;
    ensure!(
        n == 2,
        "cancel_batch cancelled {n} jobs, expected 2 (one running, one blocked)"
    );
    expect_stale(
        b.complete(&got[0].lease).await,
        "complete after cancel_batch",
    )?;
    for (id, want) in all.iter().zip([
        JobState::Cancelled,
        JobState::Succeeded,
        JobState::Cancelled,
    ]) {
        expect_state(b, &q, *id, want).await?;
    }
    let p = b
        .wait(&batch, WaitFor::Batch, Duration::from_secs(10))
        .await?;
    ensure!(p.sealed && p.is_finished(), "after cancel_batch: {p:?}");
    let res = b
        .enqueue_one(NewJob::new(&q, b"late".to_vec()).in_batch(batch.id, 3))
        .await;
    expect_invalid(res, "batch", "enqueue into a cancelled batch")?;
    claim_nothing(b, &q, "the batch is cancelled").await
}
