//! The settle's witness (see `settle.rs`): a settle that holds another unfinished job of
//! the stage skips the batch's lock and promotion. These check that it does, that
//! claims are not held up by a witness, and that under concurrent settles every stage
//! is still released, and only once the one before it has finished.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::future::join_all;
use relayq_conformance::queue_name;
use relayq_core::{
    Claim, ClaimRequest, Complete, Enqueue, JobId, NewJob, OnFailure, OrderBarrier, Retry, Settle,
    Settled, WaitFor,
};
use relayq_postgres::PostgresBackend;

mod common;
use common::{LEASE, drop_schema, fresh, jobs, url};

/// Locks `table`'s row `id` in `mode` in a transaction of its own, held until dropped.
async fn hold(
    b: &PostgresBackend,
    table: &str,
    id: i64,
    mode: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = b.pool().begin().await.unwrap();
    let sql = format!(
        "SELECT id FROM \"{}\".{table} WHERE id = $1 FOR {mode}",
        b.schema()
    );
    let got = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{table} row {id} to lock");
    tx
}

/// A claim takes a job another transaction holds `FOR KEY SHARE` (as a settle's
/// witness does), at once, instead of skipping it (SPEC C3: claims keep the order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_take_a_job_held_as_a_witness() {
    let Some(url) = url().await else { return };
    let b = fresh(&url, "wclaim").await;
    let q = queue_name("wclaim");
    let ids: Vec<JobId> = b
        .enqueue(jobs(&q, 3))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let witness = hold(&b, "jobs", ids[0].0, "KEY SHARE").await;
    let claim = b.claim(ClaimRequest::new(&q, "w", 1, LEASE));
    let got = tokio::time::timeout(Duration::from_secs(5), claim)
        .await
        .expect("the claim waited for the witness")
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lease.job, ids[0], "the earliest job, witness or not");
    witness.rollback().await.unwrap();
    drop_schema(&b).await;
}

/// A settle that finishes one job of a stage while another stays unfinished settles
/// without the batch's lock: it completes while another transaction holds the batch
/// row. The settle of the stage's last job then releases the next stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_with_a_witness_skips_the_batch_lock() {
    let Some(url) = url().await else { return };
    let b = fresh(&url, "wlock").await;
    let q = queue_name("wlock");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    let ids: Vec<JobId> = b
        .enqueue(vec![job(1), job(1), job(2)])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    b.seal(&batch).await.unwrap();
    let first = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(first.len(), 2, "stage 1 only");

    let lock = hold(&b, "batches", batch.id.0, "UPDATE").await;
    let settle = b.complete(&first[0].lease);
    tokio::time::timeout(Duration::from_secs(5), settle)
        .await
        .expect("the settle waited for the batch's lock although it had a witness")
        .unwrap();
    lock.rollback().await.unwrap();

    b.complete(&first[1].lease).await.unwrap();
    let next = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(next.len(), 1, "the last settle of stage 1 released stage 2");
    assert_eq!(next[0].lease.job, ids[2]);
    drop_schema(&b).await;
}

/// SPEC B6: a job that dies in a `Halt` batch halts it even when another job of its
/// stage is unfinished: a settle with a dead job takes the lock and promotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_job_halts_its_batch_despite_a_witness() {
    let Some(url) = url().await else { return };
    let b = fresh(&url, "whalt").await;
    let q = queue_name("whalt");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    b.enqueue(vec![job(1), job(1), job(2)]).await.unwrap();
    b.seal(&batch).await.unwrap();
    let first = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(first.len(), 2);
    let settled = b.fail(&first[0].lease, "boom", Retry::Never).await.unwrap();
    assert_eq!(settled, Settled::Dead);
    let p = b.batch_progress(&batch).await.unwrap();
    assert!(p.failed, "the dead job halted the batch: {p:?}");
    let later = p.stages.iter().find(|s| s.stage == 2).unwrap();
    assert_eq!(later.cancelled, 1, "stage 2 was cancelled: {p:?}");
    drop_schema(&b).await;
}

/// Liveness and order under load: 8 tasks on 3 handles claim one job at a time from a
/// batch of 40 stages × 5 jobs and complete it at once, so settles of one stage
/// overlap and find witnesses, or none. Every stage must be released (the batch
/// finishes), and no job may start before every job of a lower stage has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_settles_release_every_stage_in_order() {
    let Some(url) = url().await else { return };
    let first = fresh(&url, "wload").await;
    let mut handles = vec![Arc::new(first)];
    for _ in 0..2 {
        let config = relayq_postgres::Config::default()
            .with_schema(handles[0].schema().to_owned())
            .with_max_connections(4);
        handles.push(Arc::new(
            PostgresBackend::connect_with(&url, config).await.unwrap(),
        ));
    }
    let b = Arc::clone(&handles[0]);
    let q = queue_name("wload");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let (stages, per) = (40, 5);
    let all: Vec<NewJob> = (0..stages)
        .flat_map(|s| (0..per).map(move |_| s))
        .map(|s| NewJob::new(&q, s.to_string().into_bytes()).in_batch(batch.id, s))
        .collect();
    b.enqueue(all).await.unwrap();
    b.seal(&batch).await.unwrap();

    // (stage, start, end) of every job run.
    let spans = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let tasks = (0..8).map(|i| {
        let h = Arc::clone(&handles[i % handles.len()]);
        let (q, spans, batch) = (q.clone(), Arc::clone(&spans), batch.clone());
        tokio::spawn(async move {
            while !h.reached(&batch, WaitFor::Batch).await.unwrap() {
                assert!(Instant::now() < deadline, "the batch never finished");
                let got = h.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
                let Some(job) = got.into_iter().next() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let start = Instant::now();
                let stage = job.stage.unwrap();
                let end = Instant::now();
                spans.lock().unwrap().push((stage, start, end));
                let done = h.settle_many(vec![Settle::complete(job.lease)]).await;
                assert!(matches!(done.unwrap()[..], [Ok(Settled::Completed)]));
            }
        })
    });
    for t in join_all(tasks).await {
        t.unwrap();
    }
    let spans = std::mem::take(&mut *spans.lock().unwrap());
    assert_eq!(spans.len(), stages as usize * per, "every job ran once");
    for &(stage, start, _) in &spans {
        for &(earlier, _, end) in spans.iter().filter(|s| s.0 < stage) {
            assert!(
                start >= end,
                "a job of stage {stage} started before one of stage {earlier} ended"
            );
        }
    }
    drop_schema(&b).await;
}
