//! relayq-mysql against its server under production conditions: migrations from many
//! processes at once, a transaction held open beside the claims (InnoDB's purge held
//! back), producers inserting at the claim index's tail while claimers lock its head
//! (the pattern behind solid_queue's insert deadlocks), and the claim's plan in every
//! statistics state. Each test works in a database of its own.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use relayq_conformance::harness::Server;
use relayq_core::{
    Claim, ClaimRequest, CompleteExt, Enqueue, EnqueueExt, Inspect, JobState, NewJob,
};
use relayq_mysql::{Config, MysqlBackend};
use sqlx::Connection;

const SERVER: Server = Server::of(&relayq_mysql::DRIVER);
const LEASE: Duration = Duration::from_secs(60);

/// A backend on a new database, migrated; `drop` removes the database.
async fn fresh(url: &str, tag: &str) -> MysqlBackend {
    let name = format!(
        "relayq_t_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let b = MysqlBackend::connect_with(
        url,
        Config::default().with_schema(name).with_max_connections(12),
    )
    .await
    .expect("connect");
    b.migrate().await.expect("migrate");
    b
}

async fn database(b: &MysqlBackend) -> String {
    sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
        .fetch_one(b.pool())
        .await
        .unwrap()
}

async fn drop(b: &MysqlBackend) {
    let name = database(b).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE `{name}`")))
        .execute(b.pool())
        .await
        .unwrap();
    b.close().await;
}

async fn succeeded(b: &MysqlBackend, q: &str) -> u64 {
    let stats = b.queue_stats(q).await.unwrap();
    stats.counts.get(&JobState::Succeeded).copied().unwrap_or(0)
}

fn queue(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// Claims and completes until `want` jobs of `q` succeeded or the deadline passes;
/// returns the ids completed.
async fn drain(b: &MysqlBackend, q: &str, want: usize, deadline: Instant) -> Vec<i64> {
    let mut done = Vec::new();
    while done.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} done by the deadline",
            done.len()
        );
        let jobs = b
            .claim(ClaimRequest::new(q, "w", 50, LEASE))
            .await
            .expect("claim");
        for j in jobs {
            b.complete(&j.lease).await.expect("complete");
            done.push(j.lease.job.0);
        }
    }
    done
}

/// Four handles migrate one new database at once, then again: each migration runs
/// once (under `GET_LOCK`) and the version is this code's.
async fn migrations_run_concurrently_and_repeatedly(url: String) {
    let name = format!(
        "relayq_t_mig_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(
            MysqlBackend::connect_with(&url, Config::default().with_schema(name.clone()))
                .await
                .unwrap(),
        );
    }
    // Polled together: each waits for the others' migration lock.
    let runs = futures::future::join_all(handles.iter().map(MysqlBackend::migrate)).await;
    for r in runs {
        r.expect("concurrent migrate");
    }
    handles[0].migrate().await.unwrap();
    handles[1]
        .check_schema()
        .await
        .expect("at this code's version");
    let q = queue("mig");
    handles[2]
        .enqueue_one(NewJob::new(&q, vec![]))
        .await
        .unwrap();
    drop(&handles[0]).await;
}

/// A REPEATABLE READ transaction holds a snapshot open beside the queue (InnoDB keeps
/// every row version it may read, and purge keeps every delete-marked index entry):
/// jobs enqueued, claimed and completed meanwhile all run exactly once, and the
/// claim's plan stays the claim index.
async fn claims_beside_a_held_snapshot(url: String) {
    let b = fresh(&url, "snap").await;
    let q = queue("snap");
    let mut holder = sqlx::MySqlConnection::connect(&url).await.unwrap();
    let db = database(&b).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ;
         START TRANSACTION WITH CONSISTENT SNAPSHOT;
         SELECT COUNT(*) FROM `{db}`.relayq_jobs;"
    )))
    .execute(&mut holder)
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut all = HashSet::new();
    for round in 0..5 {
        let jobs: Vec<NewJob> = (0..400)
            .map(|i| NewJob::new(&q, vec![round, (i % 256) as u8]))
            .collect();
        b.enqueue(jobs).await.unwrap();
        for id in drain(&b, &q, 400, deadline).await {
            assert!(all.insert(id), "job {id} completed twice");
        }
    }
    assert_eq!(all.len(), 2000);
    let stats = b.queue_stats(&q).await.unwrap();
    assert_eq!(
        stats.counts.get(&JobState::Succeeded),
        Some(&2000),
        "{stats:?}"
    );
    let plan = b.explain_claim(&q, 50).await.unwrap();
    assert!(
        plan.contains("relayq_jobs_claim") && !plan.contains("filesort"),
        "{plan}"
    );
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    drop(&b).await;
}

/// Producers insert single jobs at the claim index's tail while claimers lock its head,
/// with four claimers and two producers on their own handles: no call fails (a
/// deadlock, were there one, is run again inside), and every job runs once.
async fn producers_at_the_tail_beside_claimers(url: String) {
    let b = fresh(&url, "tail").await;
    let q = queue("tail");
    let total = 1500;
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..2u8 {
        let (b, q) = (b.clone(), q.clone());
        producers.push(tokio::spawn(async move {
            for i in 0..total / 2 {
                b.enqueue_one(NewJob::new(&q, vec![p, (i % 256) as u8]))
                    .await
                    .expect("enqueue");
            }
        }));
    }
    let mut claimers = Vec::new();
    for w in 0..4 {
        let (b, q, stop) = (b.clone(), q.clone(), stop.clone());
        claimers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let jobs = b
                    .claim(ClaimRequest::new(&q, format!("w{w}"), 5, LEASE))
                    .await
                    .expect("claim");
                if jobs.is_empty() {
                    tokio::task::yield_now().await;
                }
                for j in jobs {
                    b.complete(&j.lease).await.expect("complete");
                    done.push(j.lease.job.0);
                }
            }
            done
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while succeeded(&b, &q).await < total as u64 {
        assert!(Instant::now() < deadline, "not drained by the deadline");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = HashSet::new();
    for c in claimers {
        for id in c.await.unwrap() {
            assert!(all.insert(id), "job {id} completed twice");
        }
    }
    assert_eq!(all.len(), total);
    let info = b
        .job(&q, relayq_core::JobId(*all.iter().next().unwrap()))
        .await
        .unwrap();
    assert_eq!(info.state, JobState::Succeeded);
    assert_eq!(info.attempts, 1);
    drop(&b).await;
}

/// The claim reads the claim index from the queue's head, sorting nothing, in every
/// statistics state: a new table, statistics taken on a small table that then grew to
/// 20,000 jobs of another queue, and statistics taken on the large table.
async fn the_claim_plan_holds_in_every_statistics_state(url: String) {
    let b = fresh(&url, "plan").await;
    let q = queue("plan");
    let other = queue("other");
    let check = |plan: String, when: &str| {
        assert!(
            plan.contains("relayq_jobs_claim") && !plan.contains("filesort"),
            "{when}: {plan}"
        );
    };
    check(b.explain_claim(&q, 50).await.unwrap(), "new table");
    b.enqueue((0..10).map(|_| NewJob::new(&q, vec![])).collect())
        .await
        .unwrap();
    sqlx::query("ANALYZE TABLE relayq_jobs")
        .execute(b.pool())
        .await
        .unwrap();
    for _ in 0..4 {
        b.enqueue((0..5000).map(|_| NewJob::new(&other, vec![])).collect())
            .await
            .unwrap();
    }
    check(
        b.explain_claim(&q, 50).await.unwrap(),
        "analyzed small, grown",
    );
    sqlx::query("ANALYZE TABLE relayq_jobs")
        .execute(b.pool())
        .await
        .unwrap();
    check(b.explain_claim(&q, 50).await.unwrap(), "analyzed large");
    let claimed = b
        .claim(ClaimRequest::new(&q, "w", 50, LEASE))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 10);
    drop(&b).await;
}

/// The most jobs one call takes (10,000) go in several inserts (a prepared statement
/// takes at most 65,535 placeholders): the ids come back in input order, each on its
/// own job.
async fn the_most_jobs_of_one_call_keep_their_order(url: String) {
    let b = fresh(&url, "many").await;
    let q = queue("many");
    let n: u16 = 10_000;
    let jobs = (0..n)
        .map(|i| NewJob::new(&q, i.to_be_bytes().to_vec()))
        .collect();
    let ids: Vec<i64> = b
        .enqueue(jobs)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id.0)
        .collect();
    assert!(
        ids.is_sorted() && ids.len() == usize::from(n),
        "ids out of order"
    );
    for i in [0, 3999, 4000, 7999, 8000, usize::from(n) - 1] {
        let info = b.job(&q, relayq_core::JobId(ids[i])).await.unwrap();
        let want = u16::try_from(i).unwrap().to_be_bytes().to_vec();
        assert_eq!(info.payload, want, "job {i}");
    }
    drop(&b).await;
}

/// A write in one queue never hides another queue's head from its claims. Each round
/// opens a batch in queue A, then one in queue B (the next batch id, so B's first job
/// follows A's last in every batch index), and halts A's batch while B claims: B's
/// claim always finds B's job. (Writing through a range of a secondary index would lock
/// the entry past it until commit, and B's claim, which skips locked rows, came back
/// empty in about one round in five.)
async fn a_write_in_one_queue_hides_nothing_from_another(url: String) {
    use relayq_core::{OnFailure, OrderBarrier, Retry};
    let b = fresh(&url, "hide").await;
    let (qa, qb) = (queue("hide-a"), queue("hide-b"));
    for round in 0..60 {
        let ba = b.open_batch(&qa, OnFailure::Halt).await.unwrap();
        let bb = b.open_batch(&qb, OnFailure::Continue).await.unwrap();
        b.enqueue(vec![
            NewJob::new(&qa, vec![]).in_batch(ba.id, 1),
            NewJob::new(&qa, vec![]).in_batch(ba.id, 2),
        ])
        .await
        .unwrap();
        b.enqueue(vec![NewJob::new(&qb, vec![]).in_batch(bb.id, 1)])
            .await
            .unwrap();
        let first = b
            .claim(ClaimRequest::new(&qa, "w", 1, LEASE))
            .await
            .unwrap();
        let (halted, claimed) = tokio::join!(
            b.fail(&first[0].lease, "halt", Retry::Never),
            b.claim(ClaimRequest::new(&qb, "w", 1, LEASE)),
        );
        halted.unwrap();
        let claimed = claimed.unwrap();
        assert_eq!(
            claimed.len(),
            1,
            "round {round}: B's job was hidden from its claim"
        );
        b.complete(&claimed[0].lease).await.unwrap();
        b.seal(&bb).await.unwrap();
    }
    drop(&b).await;
}

relayq_conformance::server_tests! {
    server: SERVER,
    tests: [
        migrations_run_concurrently_and_repeatedly,
        claims_beside_a_held_snapshot,
        producers_at_the_tail_beside_claimers,
        the_claim_plan_holds_in_every_statistics_state,
        the_most_jobs_of_one_call_keep_their_order,
        a_write_in_one_queue_hides_nothing_from_another,
    ],
}
