//! The settle's witness (see `settle.rs`): a settle that holds another unfinished job of
//! the stage skips the batch's lock and promotion. These check that it does, that
//! claims are not held up by a witness, and that under concurrent settles every stage
//! is still released, and only once the one before it has finished.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::join_all;
use relayq_conformance::{poll_until, queue_name};
use relayq_core::{
    Claim, ClaimRequest, Complete, CompleteExt, Enqueue, Inspect, JobId, JobState, NewJob,
    OnFailure, OrderBarrier, Retry, Settle, Settled, WaitFor,
};
use relayq_postgres::PostgresBackend;

mod common;
use common::{LEASE, drop_schema, fresh, jobs};

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
async fn claims_take_a_job_held_as_a_witness(url: String) {
    let b = fresh(&url, "wclaim").await;
    let q = queue_name("wclaim");
    let ids = ids(b.enqueue(jobs(&q, 3)).await.unwrap());
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

/// SPEC B2: a settle that finishes one job of a stage while another waits to run settles
/// without the batch's lock: it completes while another transaction holds the batch
/// row. The settle of the stage's last job then releases the next stage.
async fn a_settle_with_a_witness_skips_the_batch_lock(url: String) {
    let b = fresh(&url, "wlock").await;
    let q = queue_name("wlock");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    let ids = ids(b
        .enqueue(vec![job(1), job(1), job(1), job(2)])
        .await
        .unwrap());
    b.seal(&batch).await.unwrap();
    let first = b.claim(ClaimRequest::new(&q, "w", 2, LEASE)).await.unwrap();
    assert_eq!(first.len(), 2);

    let lock = hold(&b, "batches", batch.id.0, "UPDATE").await;
    let settle = b.complete(&first[0].lease);
    tokio::time::timeout(Duration::from_secs(5), settle)
        .await
        .expect("the settle waited for the batch's lock although it had a witness")
        .unwrap();
    lock.rollback().await.unwrap();

    b.complete(&first[1].lease).await.unwrap();
    let last = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(last.len(), 1, "stage 2 waits for the last job of stage 1");
    assert_eq!(last[0].lease.job, ids[2]);
    b.complete(&last[0].lease).await.unwrap();
    let next = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(next.len(), 1, "the last settle of stage 1 released stage 2");
    assert_eq!(next[0].lease.job, ids[3]);
    drop_schema(&b).await;
}

/// SPEC B2: the witness is locked until its settle commits: the witness's own settle waits for
/// it. Settle 1 finishes X, takes R as its witness, and then waits (for X's group,
/// whose lock this test holds). R is claimed and settled meanwhile, without a witness:
/// it must wait for settle 1 to commit, so that its promotion sees X finished and
/// releases stage 2. Were the witness not locked, settle 2 would promote first, find X
/// unfinished and release nothing, and settle 1 would skip the promotion: stage 2
/// would never run.
async fn the_witness_settles_after_the_settle_holding_it(url: String) {
    let b = Arc::new(fresh(&url, "wheld").await);
    let q = queue_name("wheld");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    let ids = ids(b
        .enqueue(vec![job(1).group("gx"), job(1), job(2)])
        .await
        .unwrap());
    b.seal(&batch).await.unwrap();
    let x = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
    assert_eq!(x[0].lease.job, ids[0]);

    // The advisory lock settles take for a group (see `promote::settle_groups`).
    let key = format!("{}\u{1f}{q}\u{1f}gx", b.schema());
    let mut group = b.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut *group)
        .await
        .unwrap();
    let first = tokio::spawn({
        let (b, lease) = (Arc::clone(&b), x[0].lease.clone());
        async move { b.complete(&lease).await }
    });
    poll_until(
        "settle 1 to wait for the group",
        Duration::from_secs(10),
        || {
            let (pool, key) = (b.pool().clone(), key.clone());
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND (classid::bigint << 32 | objid::bigint) = hashtextextended($1, 0)",
                )
                .bind(key)
                .fetch_one(&pool)
                .await?;
                Ok((waiting > 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();

    let r = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(r.len(), 1, "a claim takes the witness at once");
    assert_eq!(r[0].lease.job, ids[1]);
    let second = tokio::spawn({
        let (b, lease) = (Arc::clone(&b), r[0].lease.clone());
        async move { b.complete(&lease).await }
    });
    // Settle 2 waits for settle 1 (found by the advisory lock it waits for), or ends.
    poll_until("settle 2 to wait or end", Duration::from_secs(10), || {
        let (pool, key, ended) = (b.pool().clone(), key.clone(), second.is_finished());
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity a, pg_locks l
                 WHERE l.locktype = 'advisory' AND NOT l.granted
                   AND (l.classid::bigint << 32 | l.objid::bigint) = hashtextextended($1, 0)
                   AND l.pid = ANY (pg_blocking_pids(a.pid))",
            )
            .bind(key)
            .fetch_one(&pool)
            .await?;
            Ok((ended || waiting > 0).then_some(()))
        }
    })
    .await
    .unwrap();
    group.rollback().await.unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();

    let next = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(next.len(), 1, "stage 2 was released");
    assert_eq!(next[0].lease.job, ids[2]);
    drop_schema(&b).await;
}

/// SPEC B3, B6: a job that dies in a `Halt` batch while another transaction adds a
/// later-stage job to the batch cancels that job too, although another job of its
/// stage waits to run. The settle must lock the batch before its halt statement, so
/// that the halt sees the new job once the other transaction commits.
async fn a_dead_job_halts_jobs_added_meanwhile(url: String) {
    let b = Arc::new(fresh(&url, "whalt").await);
    let q = queue_name("whalt");
    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    b.enqueue(vec![job(1), job(1)]).await.unwrap();
    let first = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();

    // The enqueue holds the batch's row until it commits.
    let mut adding = b.pool().begin().await.unwrap();
    let added = ids(b.enqueue_in(&mut adding, vec![job(5)]).await.unwrap());
    let settle = tokio::spawn({
        let (b, lease) = (Arc::clone(&b), first[0].lease.clone());
        async move { b.fail(&lease, "boom", Retry::Never).await }
    });
    let schema = b.schema().to_owned();
    poll_until(
        "the settle to wait for a lock",
        Duration::from_secs(10),
        || {
            let (pool, schema) = (b.pool().clone(), schema.clone());
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                )
                .bind(schema)
                .fetch_one(&pool)
                .await?;
                Ok((waiting > 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    adding.commit().await.unwrap();
    assert_eq!(settle.await.unwrap().unwrap(), Settled::Dead);

    let p = b.batch_progress(&batch).await.unwrap();
    assert!(p.failed, "the dead job halted the batch: {p:?}");
    let info = b.job(&q, added[0]).await.unwrap();
    assert_eq!(info.state, JobState::Cancelled, "the job added meanwhile");
    drop_schema(&b).await;
}

/// SPEC B2, liveness and order under load: 6 tasks on 3 handles claim one job at a time from
/// a batch of 15 stages × 12 jobs and complete it at once, so settles of one stage
/// overlap, with witnesses and without. Every stage must be released (the batch
/// finishes), and no job may be claimed before every job of a lower stage has
/// finished.
async fn concurrent_settles_release_every_stage_in_order(url: String) {
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
    let (stages, per) = (15, 12);
    let all: Vec<NewJob> = (0..stages)
        .flat_map(|s| (0..per).map(move |_| s))
        .map(|s| NewJob::new(&q, s.to_string().into_bytes()).in_batch(batch.id, s))
        .collect();
    b.enqueue(all).await.unwrap();
    b.seal(&batch).await.unwrap();

    // `jobs` holds only unfinished jobs: once a claim returns a job of stage s, no job
    // of a lower stage may be left there (no clock involved).
    let lower = format!(
        "SELECT count(*) FROM \"{}\".jobs WHERE batch_id = $1 AND stage < $2",
        b.schema()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let tasks = (0..6).map(|i| {
        let h = Arc::clone(&handles[i % handles.len()]);
        let (q, batch, lower) = (q.clone(), batch.clone(), lower.clone());
        tokio::spawn(async move {
            while !h.reached(&batch, WaitFor::Batch).await.unwrap() {
                assert!(Instant::now() < deadline, "the batch never finished");
                let got = h.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
                let Some(job) = got.into_iter().next() else {
                    // Poll interval: the next stage is not released yet.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let stage = job.stage.unwrap();
                let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(lower.clone()))
                    .bind(batch.id.0)
                    .bind(stage)
                    .fetch_one(h.pool())
                    .await
                    .unwrap();
                assert_eq!(
                    left, 0,
                    "a job of stage {stage} ran before lower stages finished"
                );
                let done = h.settle_many(vec![Settle::complete(job.lease)]).await;
                assert!(matches!(done.unwrap()[..], [Ok(Settled::Completed)]));
            }
        })
    });
    for t in join_all(tasks).await {
        t.unwrap();
    }
    let p = b.batch_progress(&batch).await.unwrap();
    let succeeded: u64 = p.stages.iter().map(|s| s.succeeded).sum();
    assert_eq!(
        succeeded,
        stages as u64 * per as u64,
        "every job ran once: {p:?}"
    );
    assert!(p.is_finished(), "{p:?}");
    drop_schema(&b).await;
}

fn ids(enqueued: Vec<relayq_core::Enqueued>) -> Vec<JobId> {
    enqueued.into_iter().map(|e| e.id).collect()
}

relayq_conformance::server_tests! {
    server: common::SERVER,
    tests: [
        claims_take_a_job_held_as_a_witness,
        a_settle_with_a_witness_skips_the_batch_lock,
        the_witness_settles_after_the_settle_holding_it,
        a_dead_job_halts_jobs_added_meanwhile,
        concurrent_settles_release_every_stage_in_order,
    ],
}
