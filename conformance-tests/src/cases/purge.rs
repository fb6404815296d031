//! SPEC B9 — a purge cancels every unfinished job of a queue, running ones included.

use std::time::Duration;

use anyhow::{Context, ensure};
use chrono::Utc;
use relayq_core::{
    AttemptOutcome, ClaimedJob, CompleteExt, JobId, JobState, NewJob, OnFailure, Retry, Settle,
    cancelled_by,
    worker::{JobContext, JobError, Worker},
};
use tokio::sync::mpsc;

use super::support::{
    LEASE, PATIENCE, claim_exactly, claim_nothing, enqueue, enqueue_all, expect_invalid,
    expect_stale, expect_state,
};
use crate::{Env, queue_name};

/// SPEC B9, B7: a purge cancels jobs in every unfinished state (scheduled, ready,
/// blocked behind a group or a stage, retrying, running) and seals their batches; the
/// running job's attempt says it was purged, its late completion is stale; finished
/// jobs and the queue's settings stay; a second purge finds nothing; a bad queue name
/// is `InvalidInput`.
pub async fn b9_purge_cancels_every_unfinished_job(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b9purge");
    let done = enqueue(b, NewJob::new(&q, b"done".to_vec())).await?;
    let got = claim_exactly(b, &q, &[done]).await?;
    b.complete(&got[0].lease).await?;
    let retrying = enqueue(b, NewJob::new(&q, b"retry".to_vec()).max_attempts(3)).await?;
    let got = claim_exactly(b, &q, &[retrying]).await?;
    b.settle_one(Settle::fail(
        got[0].lease.clone(),
        "again later",
        Retry::After(Duration::from_secs(3600)),
    ))
    .await?;
    let running = enqueue(b, NewJob::new(&q, b"run".to_vec()).group("g")).await?;
    let lease = claim_exactly(b, &q, &[running]).await?.remove(0).lease;
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let mut ids = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"behind the group".to_vec()).group("g"),
            NewJob::new(&q, b"ready".to_vec()),
            NewJob::new(&q, b"later".to_vec()).run_at(Utc::now() + Duration::from_secs(3600)),
            NewJob::new(&q, b"stage 1".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"stage 2".to_vec()).in_batch(batch.id, 2),
        ],
    )
    .await?;
    ids.extend([retrying, running]);
    b.pause(&q).await?;

    let n = b.purge(&q).await?;
    ensure!(n == 7, "purge cancelled {n} jobs, expected 7");
    for id in &ids {
        expect_state(b, &q, *id, JobState::Cancelled).await?;
    }
    expect_state(b, &q, done, JobState::Succeeded).await?;
    expect_stale(b.complete(&lease).await, "a completion after the purge")?;
    ensure!(
        b.lost_leases(std::slice::from_ref(&lease)).await? == [running],
        "the purged lease should be lost"
    );
    let log = b.job(&q, running).await?.attempt_log;
    ensure!(
        log.len() == 1
            && log[0].outcome == AttemptOutcome::Cancelled
            && log[0].error.as_deref() == Some(cancelled_by::PURGE),
        "the running attempt should say it was purged: {log:?}"
    );
    expect_invalid(
        b.enqueue(vec![NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, 3)])
            .await,
        "batch",
        "an enqueue into a purged batch",
    )?;
    let stats = b.queue_stats(&q).await?;
    ensure!(stats.paused, "the purge resumed the queue");
    ensure!(
        stats.total() == stats.count(JobState::Succeeded) + stats.count(JobState::Cancelled),
        "unfinished jobs left: {stats:?}"
    );
    ensure!(b.purge(&q).await? == 0, "a second purge found jobs");
    ensure!(
        b.purge(&queue_name("b9never")).await? == 0,
        "a queue never used"
    );
    expect_invalid(b.purge("bad queue").await, "queue", "a bad queue name")?;
    b.resume(&q).await?;
    claim_nothing(b, &q, "the purged jobs never run").await
}

/// SPEC B9, B8: a purge stops the handlers running the queue's jobs at once, through
/// the worker running them.
pub async fn b9_purge_stops_the_running_handlers(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b9stop");
    let ids = enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"a".to_vec()),
            NewJob::new(&q, b"b".to_vec()).group("g"),
        ],
    )
    .await?;
    let (started_tx, mut started) = mpsc::unbounded_channel::<JobId>();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<JobId>();
    let worker = Worker::builder(env.connect().await?, [q.clone()])
        .concurrency(2)
        .prefetch(0)
        .lease(LEASE)
        .no_maintenance()
        .handler(move |job: ClaimedJob| {
            let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
            async move {
                let id = job.lease.job;
                let token = JobContext::current().expect("in a handler").stopping();
                tokio::spawn(async move {
                    token.cancelled().await;
                    let _ = stopped_tx.send(id);
                });
                let _ = started_tx.send(id);
                std::future::pending::<Result<(), JobError>>().await
            }
        })
        .build()?
        .spawn();
    for _ in 0..2 {
        tokio::time::timeout(PATIENCE, started.recv())
            .await
            .context("the jobs did not start")?
            .context("the worker ended")?;
    }
    ensure!(b.purge(&q).await? == 2, "the purge should cancel both");
    // Before the first heartbeat (a third of the lease): only the push or the lease
    // read can stop them.
    let mut both = Vec::new();
    for _ in 0..2 {
        let id = tokio::time::timeout(LEASE / 4, stopped.recv())
            .await
            .context("a purged job's handler was not stopped in time")?
            .context("channel closed")?;
        both.push(id);
    }
    both.sort_unstable();
    ensure!(both == ids, "stopped {both:?}, expected {ids:?}");
    let report = worker.shutdown().await?;
    ensure!(
        report.lease_lost == 2,
        "the worker should count two lost leases: {report:?}"
    );
    Ok(())
}
