//! SPEC B8 — a cancel reaches the running handler at once.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::{Context, ensure};
use relayq_core::{
    AttemptOutcome, Backend, ClaimedJob, CompleteExt, Events, JobId, JobState, Lease, LeaseToken,
    NewJob, OnFailure, cancelled_by,
    worker::{JobContext, JobError, Worker},
};
use tokio::{sync::mpsc, time::Instant};

use super::support::{
    LEASE, PATIENCE, SHORT_LEASE, TIME_SLACK, claim_as, claim_exactly, claim_nothing, enqueue,
    enqueue_all, enqueue_n, expect_invalid, expect_stale, expect_state, poll_claim,
};
use crate::{Env, poll_until, queue_name};

/// How soon a cancel must stop a handler in these cases: before the first heartbeat (a
/// third of [`LEASE`] after the claim), so only the push or the lease read can do it,
/// with room for a loaded machine. The latency itself is the bench's to measure.
const STOP_WITHIN: Duration = Duration::from_secs(8);

/// SPEC B8, X2: `lost_leases` names the leases that no longer hold (cancelled, finished,
/// another token) and not one that still holds, even past its expiry; a cancelled job
/// whose lease had run out is not brought back by maintenance or a claim. Over 1000
/// leases, or a bad queue name, is `InvalidInput` naming the field.
pub async fn b8_lost_leases_names_what_no_longer_holds(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b8lost");
    let all = enqueue_n(b, &q, 3).await?;
    let got = claim_exactly(b, &q, &all).await?;
    let (cancelled, done, held) = (&got[0].lease, &got[1].lease, &got[2].lease);
    b.cancel_job(&q, cancelled.job).await?;
    b.complete(done).await?;
    let forged = Lease {
        token: LeaseToken(uuid::Uuid::new_v4()),
        ..held.clone()
    };
    let mut lost = b
        .lost_leases(&[
            cancelled.clone(),
            done.clone(),
            held.clone(),
            forged.clone(),
        ])
        .await?;
    lost.sort_unstable();
    let mut want = vec![cancelled.job, done.job, forged.job];
    want.sort_unstable();
    want.dedup();
    ensure!(lost == want, "lost_leases said {lost:?}, expected {want:?}");
    ensure!(
        b.lost_leases(&[]).await?.is_empty(),
        "no leases, nothing lost"
    );
    let too_many = vec![held.clone(); 1001];
    expect_invalid(b.lost_leases(&too_many).await, "leases", "1001 leases")?;
    let elsewhere = Lease {
        queue: "bad queue".into(),
        ..held.clone()
    };
    expect_invalid(
        b.lost_leases(&[held.clone(), elsewhere]).await,
        "queue",
        "a lease of a bad queue name",
    )?;

    // A lease past its expiry that nothing took yet still holds; cancelled then, the
    // job stays cancelled through maintenance and claims.
    let late = enqueue_n(b, &q, 1).await?[0];
    let short = claim_as(b, &q, "w", 1, SHORT_LEASE).await?.remove(0).lease;
    ensure!(short.job == late, "claimed {} not {late}", short.job);
    // A probe job due just after the lease's end shows when the server's clock passed
    // it, without touching the leased job.
    let probe = queue_name("b8probe");
    let due = short.expires_at + TIME_SLACK;
    enqueue(b, NewJob::new(&probe, b"probe".to_vec()).run_at(due)).await?;
    poll_claim(
        b,
        &probe,
        "probe",
        1,
        LEASE,
        "server time to pass the lease's end",
    )
    .await?;
    ensure!(
        b.lost_leases(std::slice::from_ref(&short))
            .await?
            .is_empty(),
        "an expired lease nothing took was reported lost"
    );
    ensure!(b.cancel_job(&q, late).await?, "cancel of the expired job");
    ensure!(
        b.lost_leases(std::slice::from_ref(&short)).await? == [late],
        "a cancelled lease was not reported lost"
    );
    b.maintain(&q, relayq_core::DEFAULT_RETENTION).await?;
    expect_state(b, &q, late, JobState::Cancelled).await?;
    expect_stale(b.complete(&short).await, "complete after the cancel")?;
    claim_nothing(b, &q, "every job is finished or held").await
}

/// SPEC B8, B7: a cancel of a running job, and of a batch with running jobs, stops
/// their handlers long before the next heartbeat, from another handle; the late
/// completion is stale, the jobs stay cancelled, their attempts are logged as
/// cancelled, and they never run again.
pub async fn b8_cancel_stops_the_running_handler(env: &Env) -> anyhow::Result<()> {
    cancel_stops(env, env.connect().await?, "b8stop").await
}

/// SPEC B8: the same through the lease read alone, as on a backend that cannot push
/// cancels (or a worker in another process from the canceller, on SQLite): the worker's
/// handle hears no events.
pub async fn b8_cancel_reaches_a_worker_that_only_reads(env: &Env) -> anyhow::Result<()> {
    let deaf = Arc::new(Deaf(env.connect().await?));
    cancel_stops(env, deaf, "b8read").await
}

/// SPEC B8: the same for a worker of a push backend whose listener is away (its handle
/// says cancels are pushed, but hears nothing): its read every second stops the job
/// long before the first heartbeat.
pub async fn b8_a_worker_whose_listener_is_away_still_stops(env: &Env) -> anyhow::Result<()> {
    let away = Arc::new(Away(env.connect().await?));
    cancel_stops(env, away, "b8away").await
}

/// Sends `(id, when)` on `stopped` once the running handler's stop token fires, from a
/// task of its own: the handler's future is dropped at that moment.
fn report_stop(id: JobId, stopped: mpsc::UnboundedSender<(JobId, Instant)>) {
    let token = JobContext::current().expect("in a handler").stopping();
    tokio::spawn(async move {
        token.cancelled().await;
        let _ = stopped.send((id, Instant::now()));
    });
}

/// A handle that hears nothing: no events, no pushed cancels.
struct Deaf(Arc<dyn Backend>);

relayq_core::delegate!(Deaf, 0 => Enqueue, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

impl Events for Deaf {}

/// A handle of a push backend whose listener is away: it says cancels are pushed, and
/// hears none.
struct Away(Arc<dyn Backend>);

relayq_core::delegate!(Away, 0 => Enqueue, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

impl Events for Away {
    fn pushes_revocations(&self) -> bool {
        true
    }
}

async fn cancel_stops(env: &Env, handle: Arc<dyn Backend>, tag: &str) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name(tag);
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"alone".to_vec()),
            NewJob::new(&q, b"in batch".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"in batch".to_vec()).in_batch(batch.id, 1),
        ],
    )
    .await?;
    b.seal(&batch).await?;
    // Each handler reports its start, then waits forever; its stop token reports when
    // the worker stops it.
    let (started_tx, mut started) = mpsc::unbounded_channel::<(JobId, Lease)>();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<(JobId, Instant)>();
    let worker = Worker::builder(handle, [q.clone()])
        .concurrency(4)
        .prefetch(0)
        .lease(LEASE)
        .no_maintenance()
        .handler(move |job: ClaimedJob| {
            let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
            async move {
                let id = job.lease.job;
                report_stop(id, stopped_tx);
                let _ = started_tx.send((id, job.lease.clone()));
                std::future::pending::<Result<(), JobError>>().await
            }
        })
        .build()?
        .spawn();
    let mut leases = Vec::new();
    for _ in 0..3 {
        let (_, lease) = tokio::time::timeout(PATIENCE, started.recv())
            .await
            .context("the three jobs did not start")?
            .context("the worker ended")?;
        leases.push(lease);
    }
    leases.sort_by_key(|l| l.job);

    let asked = Instant::now();
    ensure!(b.cancel_job(&q, all[0]).await?, "cancel of the running job");
    let (id, at) = tokio::time::timeout(STOP_WITHIN, stopped.recv())
        .await
        .context("the cancelled job's handler was not stopped in time")?
        .context("channel closed")?;
    ensure!(
        id == all[0],
        "job {id} stopped, not the cancelled {}",
        all[0]
    );
    ensure!(at >= asked, "stopped before the cancel");

    ensure!(b.cancel_batch(&batch).await? == 2, "cancel of the batch");
    let mut both = Vec::new();
    for _ in 0..2 {
        let (id, _) = tokio::time::timeout(STOP_WITHIN, stopped.recv())
            .await
            .context("a cancelled batch job's handler was not stopped in time")?
            .context("channel closed")?;
        both.push(id);
    }
    both.sort_unstable();
    ensure!(
        both == all[1..],
        "stopped {both:?}, expected {:?}",
        &all[1..]
    );

    let report = worker.shutdown().await?;
    ensure!(
        report.lease_lost == 3 && report.succeeded == 0,
        "the worker should count three lost leases and no success: {report:?}"
    );
    for lease in &leases {
        expect_stale(b.complete(lease).await, "a completion after the cancel")?;
        expect_state(b, &q, lease.job, JobState::Cancelled).await?;
        let log = b.job(&q, lease.job).await?.attempt_log;
        let why = if lease.job == all[0] {
            cancelled_by::JOB
        } else {
            cancelled_by::BATCH
        };
        ensure!(
            log.len() == 1
                && log[0].outcome == AttemptOutcome::Cancelled
                && log[0].error.as_deref() == Some(why),
            "job {} should have one attempt, cancelled ({why:?}): {log:?}",
            lease.job
        );
    }
    b.maintain(&q, relayq_core::DEFAULT_RETENTION).await?;
    claim_nothing(b, &q, "the cancelled jobs never run again").await
}

/// SPEC B6, B8: a job dying in a `Halt` batch stops its stage's running sibling at once,
/// through the worker running it: the sibling ends `cancelled`, its attempt logged so.
pub async fn b8_halt_stops_the_running_siblings(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b8halt");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"die".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"wait".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"later".to_vec()).in_batch(batch.id, 2),
        ],
    )
    .await?;
    b.seal(&batch).await?;
    // The dying job dies once the waiting one runs.
    let waiting = Arc::new(tokio::sync::Notify::new());
    let (died_tx, mut died) = mpsc::unbounded_channel::<()>();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<(JobId, Instant)>();
    let worker = Worker::builder(env.connect().await?, [q.clone()])
        .concurrency(2)
        .prefetch(0)
        .lease(LEASE)
        .no_maintenance()
        .handler(move |job: ClaimedJob| {
            let (waiting, died_tx, stopped_tx) =
                (waiting.clone(), died_tx.clone(), stopped_tx.clone());
            async move {
                if job.payload == b"die" {
                    waiting.notified().await;
                    let _ = died_tx.send(());
                    return Err(JobError::permanent("dies, halting the batch"));
                }
                report_stop(job.lease.job, stopped_tx);
                waiting.notify_one();
                std::future::pending::<Result<(), JobError>>().await
            }
        })
        .build()?
        .spawn();
    tokio::time::timeout(PATIENCE, died.recv())
        .await
        .context("the jobs did not start")?
        .context("channel closed")?;
    let (id, _) = tokio::time::timeout(STOP_WITHIN, stopped.recv())
        .await
        .context("the running sibling was not stopped after the halt")?
        .context("channel closed")?;
    ensure!(id == all[1], "job {id} stopped, not the sibling {}", all[1]);
    let report = worker.shutdown().await?;
    ensure!(
        report.lease_lost == 1,
        "the worker should count one lost lease: {report:?}"
    );
    let p = b.batch_progress(&batch).await?;
    ensure!(p.failed, "the batch does not report failed: {p:?}");
    for (id, want) in all
        .iter()
        .zip([JobState::Dead, JobState::Cancelled, JobState::Cancelled])
    {
        expect_state(b, &q, *id, want).await?;
    }
    let log = b.job(&q, all[1]).await?.attempt_log;
    ensure!(
        log.len() == 1
            && log[0].outcome == AttemptOutcome::Cancelled
            && log[0].error.as_deref() == Some(cancelled_by::HALT),
        "the sibling's attempt should be logged as cancelled by the halt: {log:?}"
    );
    claim_nothing(b, &q, "a halted batch").await
}

/// SPEC B6, C5: one expiry pass over a `Halt` batch whose leases all ran out: the job
/// out of attempts dies and halts the batch, and its sibling, which would have retried,
/// stays cancelled (it is not brought back as `retrying` later in the same pass).
pub async fn b8_a_halt_in_an_expiry_pass_keeps_its_cancels(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b8expiry");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let all = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"dies".to_vec())
                .in_batch(batch.id, 1)
                .max_attempts(1),
            NewJob::new(&q, b"would retry".to_vec())
                .in_batch(batch.id, 1)
                .max_attempts(3),
        ],
    )
    .await?;
    let first = claim_as(b, &q, "w", 1, SHORT_LEASE).await?;
    let second = claim_as(b, &q, "w", 1, SHORT_LEASE).await?;
    ensure!(
        first.len() == 1 && second.len() == 1 && first[0].lease.job == all[0],
        "expected to claim {all:?} in order"
    );
    let probe = queue_name("b8probe");
    let due = second[0].lease.expires_at + TIME_SLACK;
    enqueue(b, NewJob::new(&probe, b"probe".to_vec()).run_at(due)).await?;
    poll_claim(
        b,
        &probe,
        "probe",
        1,
        LEASE,
        "server time to pass both leases",
    )
    .await?;
    b.maintain(&q, relayq_core::DEFAULT_RETENTION).await?;
    expect_state(b, &q, all[0], JobState::Dead).await?;
    expect_state(b, &q, all[1], JobState::Cancelled).await?;
    ensure!(
        b.batch_progress(&batch).await?.failed,
        "the batch should be halted"
    );
    claim_nothing(b, &q, "a halted batch").await
}

/// SPEC B8: a job cancelled while it waits in its worker's buffer (claimed ahead, not
/// started) is stopped as soon as it starts, not at its first heartbeat; and it is
/// the worker's own read of the lease that does it, since the cancel's news came
/// before the job started.
pub async fn b8_a_job_cancelled_in_the_buffer_stops_as_it_starts(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b8buffer");
    let all = enqueue_n(b, &q, 2).await?;
    let (started_tx, mut started) = mpsc::unbounded_channel::<(JobId, Instant)>();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<(JobId, Instant)>();
    // One slot and one job claimed ahead: the second job waits in the buffer.
    let worker = Worker::builder(env.connect().await?, [q.clone()])
        .concurrency(1)
        .prefetch(1)
        .lease(LEASE)
        .shutdown_timeout(Duration::from_millis(100))
        .no_maintenance()
        .handler(move |job: ClaimedJob| {
            let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
            async move {
                let id = job.lease.job;
                report_stop(id, stopped_tx);
                let _ = started_tx.send((id, Instant::now()));
                std::future::pending::<Result<(), JobError>>().await
            }
        })
        .build()?
        .spawn();
    let (first, _) = tokio::time::timeout(PATIENCE, started.recv())
        .await
        .context("the first job did not start")?
        .context("channel closed")?;
    let second = if first == all[0] { all[1] } else { all[0] };
    poll_until("the second job to be claimed ahead", PATIENCE, || async {
        let running = b.running(&q).await?;
        Ok(running.iter().any(|r| r.id == second).then_some(()))
    })
    .await?;
    ensure!(
        b.cancel_job(&q, second).await?,
        "cancel of the buffered job"
    );
    ensure!(b.cancel_job(&q, first).await?, "cancel of the running job");
    let mut stops = BTreeMap::new();
    let mut starts = BTreeMap::new();
    let cancelled = Instant::now();
    // The first job stops, freeing the slot the second waits for; the second then
    // starts at once and must stop as it starts (the worker may also drop it unstarted,
    // which it has done if it has not started a second after the first stopped).
    loop {
        let second_done = stops.contains_key(&second)
            || stops.get(&first).is_some_and(|t: &Instant| {
                !starts.contains_key(&second) && t.elapsed() > Duration::from_secs(1)
            });
        if stops.contains_key(&first) && second_done {
            break;
        }
        tokio::select! {
            Some((id, at)) = stopped.recv() => { stops.insert(id, at); }
            Some((id, at)) = started.recv() => { starts.insert(id, at); }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        ensure!(
            cancelled.elapsed() < STOP_WITHIN,
            "stops {stops:?}, starts {starts:?} {STOP_WITHIN:?} after the cancels: the buffered job ran on"
        );
    }
    worker.shutdown().await?;
    for id in [first, second] {
        expect_state(b, &q, id, JobState::Cancelled).await?;
    }
    Ok(())
}
