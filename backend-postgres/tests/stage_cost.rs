//! What adding to a batch costs: an enqueue that cannot move the batch's floor must not
//! read the floor stage. Filling one stage in chunks used to read every job already in
//! it, once per chunk: quadratic in the stage's size.
//!
//! Counted with PostgreSQL's table statistics of the session, read before and after the
//! enqueue inside its transaction (`enqueue_in`): so no other session's work is
//! counted, and nothing is flushed in between. (The "xact" counters also hold the
//! session's earlier transactions until they are flushed, hence the difference.)

use relayq_conformance::queue_name;
use relayq_core::{
    Claim, ClaimRequest, Complete, Enqueue, Inspect, JobState, NewJob, OnFailure, OrderBarrier,
    Settle, Settled,
};
use relayq_postgres::PostgresBackend;

mod common;
use common::{LEASE, drop_schema, fresh};

/// Jobs already in the released stage: the old statement read each of them.
const STAGE: u32 = 800;
/// Jobs added per call.
const ADDED: u32 = 100;

/// What the session did to `jobs`, not yet flushed.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
struct Counts {
    inserted: i64,
    updated: i64,
    /// Rows read by sequential scans, and entries returned by the table's indexes.
    read: i64,
}

async fn counts(b: &PostgresBackend, tx: &mut sqlx::PgConnection) -> Counts {
    let sql = format!(
        "SELECT pg_stat_get_xact_tuples_inserted(t) AS inserted,
                pg_stat_get_xact_tuples_updated(t) AS updated,
                pg_stat_get_xact_tuples_returned(t)
                + (SELECT COALESCE(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)
                   FROM pg_index WHERE indrelid = t)::bigint AS read
         FROM (SELECT '\"{}\".jobs'::regclass AS t) x",
        b.schema()
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(tx)
        .await
        .unwrap()
}

/// Enqueues `jobs` in a transaction of its own; returns what it did to `jobs`.
async fn enqueue_counted(b: &PostgresBackend, jobs: Vec<NewJob>) -> Counts {
    let n = i64::try_from(jobs.len()).unwrap();
    let mut tx = b.pool().begin().await.unwrap();
    let before = counts(b, &mut tx).await;
    b.enqueue_in(&mut tx, jobs).await.unwrap();
    let after = counts(b, &mut tx).await;
    tx.commit().await.unwrap();
    // The counters work here (a server with `track_counts` off would pass vacuously).
    assert_eq!(after.inserted - before.inserted, n, "inserts counted");
    Counts {
        inserted: after.inserted - before.inserted,
        updated: after.updated - before.updated,
        read: after.read - before.read,
    }
}

/// SPEC B2, B3: jobs joining the released stage are claimable at once, and jobs joining
/// a later stage wait for it; neither enqueue reads the stage's other jobs.
async fn enqueues_into_a_released_stage_do_not_read_it(url: String) {
    let b = fresh(&url, "stagecost").await;
    let q = queue_name("stagecost");
    let batch = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    let job = |stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage);
    // One job releases stage 100; the rest join it. (Jobs stored `blocked` and then
    // released leave their old row versions in the stage index until `VACUUM`, and
    // every probe of the batch's floor walks those.)
    b.enqueue(vec![job(100)]).await.unwrap();
    b.enqueue((1..STAGE).map(|_| job(100)).collect())
        .await
        .unwrap();

    let c = enqueue_counted(&b, (0..ADDED).map(|_| job(100)).collect()).await;
    assert_eq!(
        c.updated, 0,
        "jobs joining the released stage are stored ready"
    );
    assert!(
        c.read < i64::from(ADDED),
        "joining the released stage read {} rows and index entries (the stage holds {STAGE})",
        c.read
    );
    let c = enqueue_counted(&b, (0..ADDED).map(|_| job(200)).collect()).await;
    assert_eq!(c.updated, 0, "nothing is released by a later stage's jobs");
    assert!(
        c.read < i64::from(ADDED),
        "joining a later stage read {} rows and index entries (the floor stage holds {STAGE})",
        c.read
    );

    // The order barrier holds: every stage-100 job, and only those, is claimable; the
    // stage-200 jobs follow once they have all finished.
    let total = STAGE + ADDED;
    let claimed = b
        .claim(ClaimRequest::new(&q, "w", total + 1, LEASE))
        .await
        .unwrap();
    assert_eq!(
        claimed.len(),
        total as usize,
        "every stage-100 job is claimable"
    );
    assert!(claimed.iter().all(|c| c.stage == Some(100)));
    let later = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
    assert!(
        later.is_empty(),
        "a stage-200 job was claimable before stage 100 finished"
    );
    let settles = claimed.iter().map(|c| Settle::complete(c.lease.clone()));
    for r in b.settle_many(settles.collect()).await.unwrap() {
        assert_eq!(r.unwrap(), Settled::Completed);
    }
    let next = b
        .claim(ClaimRequest::new(&q, "w", ADDED + 1, LEASE))
        .await
        .unwrap();
    assert_eq!(next.len(), ADDED as usize, "stage 200 is released");
    let info = b.job(&q, next[0].lease.job).await.unwrap();
    assert_eq!(info.state, JobState::Running);
    drop_schema(&b).await;
}

relayq_conformance::server_tests! {
    server: common::SERVER,
    tests: [
        enqueues_into_a_released_stage_do_not_read_it,
    ],
}
