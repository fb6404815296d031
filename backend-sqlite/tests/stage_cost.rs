//! What adding to a batch writes: a job joining the released stage is stored ready, and
//! an enqueue that cannot move the batch's floor leaves the stage and the batch row
//! alone. Before, each such enqueue stored its jobs blocked, rewrote the batch row and
//! read the whole floor stage to flip them: filling a stage in chunks took quadratic
//! time. Triggers in the test's own file count the writes.

use relayq_core::{Claim, ClaimRequest, Enqueue, NewJob, OnFailure, OrderBarrier};
use relayq_sqlite::SqliteBackend;
use std::time::Duration;

const COUNTERS: &str = "
    CREATE TABLE counts (what TEXT PRIMARY KEY, n INTEGER NOT NULL);
    INSERT INTO counts VALUES ('flips', 0), ('batch writes', 0);
    CREATE TRIGGER count_flips AFTER UPDATE OF state ON relayq_jobs
        WHEN OLD.state = 'blocked' AND NEW.state = 'ready'
        BEGIN UPDATE counts SET n = n + 1 WHERE what = 'flips'; END;
    CREATE TRIGGER count_batch_writes AFTER UPDATE ON relayq_batches
        BEGIN UPDATE counts SET n = n + 1 WHERE what = 'batch writes'; END;";

/// (blocked jobs made ready, batch rows written) since the last call.
async fn take(b: &SqliteBackend) -> (i64, i64) {
    let n: Vec<(String, i64)> = sqlx::query_as("SELECT what, n FROM counts ORDER BY what")
        .fetch_all(b.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE counts SET n = 0")
        .execute(b.pool())
        .await
        .unwrap();
    (n[1].1, n[0].1)
}

/// SPEC B2, B3.
#[tokio::test]
async fn enqueues_into_a_released_stage_store_ready_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("stage.db").display());
    let b = SqliteBackend::open(&url).await.unwrap();
    sqlx::raw_sql(COUNTERS).execute(b.pool()).await.unwrap();
    let q = "stagecost";
    let batch = b.open_batch(q, OnFailure::Continue).await.unwrap();
    let job = |stage| NewJob::new(q, b"x".to_vec()).in_batch(batch.id, stage);

    b.enqueue(vec![job(100)]).await.unwrap();
    assert_eq!(take(&b).await, (1, 1), "the first job releases stage 100");
    b.enqueue((0..100).map(|_| job(100)).collect())
        .await
        .unwrap();
    assert_eq!(take(&b).await, (0, 0), "joining the released stage");
    b.enqueue((0..100).map(|_| job(200)).collect())
        .await
        .unwrap();
    assert_eq!(take(&b).await, (0, 0), "joining a later stage");

    // The order barrier holds: the 101 stage-100 jobs, and only those, are claimable.
    let lease = Duration::from_secs(30);
    let claimed = b
        .claim(ClaimRequest::new(q, "w", 1000, lease))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 101);
    assert!(claimed.iter().all(|c| c.stage == Some(100)));
}
