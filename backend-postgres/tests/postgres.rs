//! PostgreSQL-specific behaviour, against the real server (`RELAYQ_POSTGRES_URL`, or a
//! container, or reported as ignored). Tests that need a table of their own make a schema
//! of their own and drop it at the end.

use std::{sync::Arc, time::Duration};

use futures::future::join_all;
use relayq_conformance::{poll_until, queue_name};
use relayq_core::{
    Admin, Backend, Claim, ClaimRequest, Complete, CompleteExt, Enqueue, EnqueueExt, Error,
    EventKind, Events, Inspect, JobState, Lease, LeaseToken, NewJob, OnFailure, OrderBarrier,
    Settle, worker::Worker,
};
use relayq_postgres::{Config, PostgresBackend};

mod common;
use common::{LEASE, drop_schema, fresh, jobs, run_sql};

/// SPEC C4: a claim skips the row another transaction has locked and returns the
/// others at once, instead of waiting for that transaction.
async fn c4_claim_skips_a_row_locked_elsewhere(url: String) {
    let b = fresh(&url, "c4").await;
    let q = queue_name("c4");
    let ids: Vec<i64> = b
        .enqueue(jobs(&q, 3))
        .await
        .unwrap()
        .iter()
        .map(|e| e.id.0)
        .collect();

    let mut holder = b.pool().begin().await.unwrap();
    let sql = format!(
        "SELECT id FROM \"{}\".jobs WHERE id = $1 FOR UPDATE",
        b.schema()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(ids[0])
        .execute(&mut *holder)
        .await
        .unwrap();

    let claim = b.claim(ClaimRequest::new(&q, "w", 3, LEASE));
    let got = tokio::time::timeout(Duration::from_secs(5), claim)
        .await
        .expect("the claim waited for the locked row")
        .unwrap();
    let got: Vec<i64> = got.iter().map(|j| j.lease.job.0).collect();
    assert_eq!(
        got,
        ids[1..],
        "the locked earliest row is skipped, the others taken"
    );

    holder.rollback().await.unwrap();
    let rest = b.claim(ClaimRequest::new(&q, "w", 3, LEASE)).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].lease.job.0, ids[0]);
    drop_schema(&b).await;
}

/// PostgreSQL bug #15715: with `WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP
/// LOCKED)`, a plan chosen on a near-empty table can update more than `n` rows once the
/// table is large. The claim's MATERIALIZED CTE never does.
async fn bug_15715_claims_never_exceed_their_limit(url: String) {
    let b = fresh(&url, "bug15715").await;
    let q = queue_name("bug15715");
    b.enqueue(jobs(&q, 1)).await.unwrap();
    let vacuum = format!("VACUUM ANALYZE \"{}\".jobs", b.schema());
    sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum))
        .execute(b.pool())
        .await
        .unwrap();
    for _ in 0..10 {
        b.enqueue(jobs(&q, 1_000)).await.unwrap();
    }
    let claimers = (0..8).map(|i| {
        let b = b.clone();
        let q = q.clone();
        async move {
            let mut sizes = Vec::new();
            loop {
                let got = b
                    .claim(ClaimRequest::new(&q, format!("w{i}"), 10, LEASE))
                    .await
                    .unwrap();
                if got.is_empty() {
                    return sizes;
                }
                sizes.push(got.len());
            }
        }
    });
    let sizes: Vec<usize> = join_all(claimers).await.into_iter().flatten().collect();
    assert!(
        sizes.iter().all(|&n| n <= 10),
        "a claim of 10 returned more: {sizes:?}"
    );
    assert_eq!(
        sizes.iter().sum::<usize>(),
        10_001,
        "every job claimed once"
    );
    let stats = b.queue_stats(&q).await.unwrap();
    assert_eq!(stats.count(JobState::Running), 10_001);
    drop_schema(&b).await;
}

/// Neither the custom nor the generic plan of the claim scans the table sequentially
/// once it is large and analyzed (the generic plan is what a prepared statement may
/// switch to after five runs).
async fn claim_plans_use_the_claim_index_after_analyze(url: String) {
    let b = fresh(&url, "plan").await;
    let q = queue_name("plan");
    let other = queue_name("plan-other");
    for _ in 0..20 {
        b.enqueue(jobs(&q, 1_000)).await.unwrap();
        b.enqueue(jobs(&other, 1_000)).await.unwrap();
    }
    analyze(&b).await;
    for generic in [false, true] {
        let plan = b.explain_claim(&q, 50, generic).await.unwrap();
        assert!(!plan.contains("Seq Scan"), "generic={generic}:\n{plan}");
        assert!(plan.contains("claim_ready"), "generic={generic}:\n{plan}");
        assert!(plan.contains("jobs_running"), "generic={generic}:\n{plan}");
    }
    drop_schema(&b).await;
}

/// SPEC C3: a claim reads the head of its queue in order, not the whole queue, on a
/// large table the planner has no statistics for (before autoanalyze's first pass, or
/// on a server with autovacuum off) as after `ANALYZE`. Without statistics PostgreSQL guessed a queue of
/// three rows and read the whole queue through a bitmap scan to sort it, on every
/// claim: a drain of 50,000 jobs beside 100,000 of another queue ran at a third of its
/// speed.
async fn a_claim_reads_only_its_queues_head_with_or_without_statistics(url: String) {
    let b = fresh(&url, "head").await;
    let s = b.schema().to_owned();
    // No autoanalyze behind the test's back, on servers where autovacuum runs.
    run_sql(
        &b,
        format!("ALTER TABLE \"{s}\".jobs SET (autovacuum_enabled = false)"),
    )
    .await;
    let q = queue_name("head");
    let other = queue_name("head-other");
    for _ in 0..100 {
        b.enqueue(jobs(&other, 1_000)).await.unwrap();
    }
    for _ in 0..5 {
        b.enqueue(jobs(&q, 1_000)).await.unwrap();
    }
    // VACUUM tells the planner the table's size, and nothing about its columns.
    run_sql(&b, format!("VACUUM \"{s}\".jobs")).await;
    let analyzed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stats WHERE schemaname = $1 AND tablename = 'jobs'",
    )
    .bind(&s)
    .fetch_one(b.pool())
    .await
    .unwrap();
    assert_eq!(analyzed, 0, "the table must have no statistics");
    let (scans, read) = claim_index_reads(&url, &b, &q, 0).await;
    assert!(
        read < 100,
        "without statistics, a claim of 5 read {read} index entries"
    );
    analyze(&b).await;
    let (_, after) = claim_index_reads(&url, &b, &q, scans).await;
    let read = after - read;
    assert!(
        read < 100,
        "after ANALYZE, a claim of 5 read {read} index entries"
    );
    drop_schema(&b).await;
}

/// Claims 5 jobs of `q` on a connection of its own, which reports its reads when it
/// closes; returns the claim index's scans and entries read since the schema was made,
/// once its scans have passed `scans`.
async fn claim_index_reads(url: &str, b: &PostgresBackend, q: &str, scans: i64) -> (i64, i64) {
    let config = Config::default()
        .with_schema(b.schema().to_owned())
        .with_max_connections(1);
    let claimer = PostgresBackend::connect_with(url, config).await.unwrap();
    let got = claimer
        .claim(ClaimRequest::new(q, "w", 5, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), 5);
    claimer.pool().close().await;
    poll_until("the claim's index reads", Duration::from_secs(30), || {
        let pool = b.pool().clone();
        let s = b.schema().to_owned();
        async move {
            let row: Option<(i64, i64)> = sqlx::query_as(
                "SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes
                 WHERE schemaname = $1 AND indexrelname = 'jobs_claim'",
            )
            .bind(&s)
            .fetch_optional(&pool)
            .await?;
            Ok(row.filter(|(seen, _)| *seen > scans))
        }
    })
    .await
    .unwrap()
}

/// Refreshes the planner's statistics of the jobs table, as autovacuum would.
async fn analyze(b: &PostgresBackend) {
    run_sql(b, format!("ANALYZE \"{}\".jobs", b.schema())).await;
}

/// Both plans of the settle statement find each lease's row by primary key. Analyzed
/// while nothing runs, the table looks to have no running rows, and the planner took
/// the running index instead: every settle then read every running job of every
/// queue. The witness's candidates come from the claim index and are looked up by
/// primary key too, not through the stage index, which this table's statistics (no
/// batch jobs) make look cheaper.
async fn settle_plans_find_leases_by_id_after_analyze(url: String) {
    let b = fresh(&url, "settleplan").await;
    let q = queue_name("settleplan");
    for _ in 0..20 {
        b.enqueue(jobs(&q, 1_000)).await.unwrap();
    }
    analyze(&b).await;
    for generic in [false, true] {
        let plan = b.explain_settle(generic).await.unwrap();
        // The lookup is CTE `m`; the later CTEs delete and update by id.
        let lookup = &plan[plan.find("CTE m").unwrap()..plan.find("CTE g").unwrap()];
        assert!(lookup.contains("jobs_pkey"), "generic={generic}:\n{plan}");
        assert!(
            !lookup.contains("jobs_running"),
            "generic={generic}:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on jobs"),
            "generic={generic}:\n{plan}"
        );
        assert_witness_by_claim_index(&plan, generic);
        // Calls of plain completions delete the rows found by primary key, the ids
        // given as the index condition (see `SETTLE_COMPLETES`).
        let plan = b.explain_settle_completions(generic).await.unwrap();
        let delete = &plan[plan.find("CTE g").unwrap()..plan.find("CTE archived").unwrap()];
        assert!(
            delete.contains("Index Scan using jobs_pkey")
                && delete.contains("Index Cond: (id = ANY")
                && !delete.contains("Join")
                && !delete.contains("jobs_running"),
            "generic={generic}:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on jobs"),
            "generic={generic}:\n{plan}"
        );
        assert_witness_by_claim_index(&plan, generic);
        // Promotion's stage release reads `jobs` one batch at a time: through the
        // stage index probed per batch, or by primary key.
        let plan = b.explain_release(generic).await.unwrap();
        let reads = plan
            .lines()
            .filter(|l| l.contains("Scan") && l.contains(" on jobs "))
            .count();
        let probes = plan.matches("Index Cond: ((batch_id = b").count()
            + plan.matches("using jobs_pkey on jobs").count();
        assert!(
            reads == probes && !plan.contains("Seq Scan on jobs"),
            "generic={generic}:\n{plan}"
        );
    }
    drop_schema(&b).await;
}

/// The witness: the claim index read backwards, candidates by primary key.
fn assert_witness_by_claim_index(plan: &str, generic: bool) {
    let witness = &plan[plan.find("CTE wit").unwrap()..plan.find("CTE note").unwrap()];
    assert!(
        witness.contains("Scan Backward using jobs_claim")
            && witness.contains("jobs_pkey")
            && !witness.contains("jobs_stage"),
        "generic={generic}:\n{plan}"
    );
}

/// The listener's connection is killed: it listens again, and an enqueue made after
/// the kill still wakes an idle worker whose poll fallback is far too slow to find it.
/// Jobs are enqueued through another handle, so only the server's notifications (and
/// the resync after the reconnect) can reach the worker.
async fn killed_listener_reconnects_and_wakes_workers(url: String) {
    let b = fresh(&url, "listen").await;
    let q = queue_name("listen");
    let backend: Arc<dyn Backend> = Arc::new(b.clone());
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(backend, [q.clone()])
        .poll_min(Duration::from_secs(60))
        .poll_max(Duration::from_secs(60))
        .handler(move |job: relayq_core::ClaimedJob| {
            let done = done_tx.clone();
            async move {
                let _ = done.send(job.lease.job);
                Ok::<_, relayq_core::worker::JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();

    let on = &b;
    let first = poll_until("listener up", Duration::from_secs(10), || async move {
        Ok(listener_pid(on).await)
    })
    .await
    .unwrap();
    // The worker's first claim found nothing; it now sleeps up to 60 s between polls.
    let other = second_handle(&url, &b).await;
    let warm = other
        .enqueue_one(NewJob::new(&q, b"1".to_vec()))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), done_rx.recv()).await;
    assert_eq!(
        got.unwrap(),
        Some(warm.id),
        "a notification wakes the worker"
    );

    let mut events = b.subscribe().unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert!(killed);
    let after = other
        .enqueue_one(NewJob::new(&q, b"2".to_vec()))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), done_rx.recv()).await;
    assert_eq!(
        got.unwrap(),
        Some(after.id),
        "the worker woke after the kill"
    );

    let second = poll_until("listener back", Duration::from_secs(10), || async move {
        Ok(listener_pid(on).await.filter(|pid| *pid != first))
    })
    .await
    .unwrap();
    assert_ne!(first, second);
    // Notifications sent while it was away are lost: it tells every waiter to look.
    let resync = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if events.recv().await.unwrap().kind == EventKind::Resync {
                return;
            }
        }
    });
    resync.await.expect("a Resync event after the reconnect");
    worker.shutdown().await.unwrap();
    drop_schema(&b).await;
}

/// The backend pid LISTENing on the schema's channel, if any.
async fn listener_pid(b: &PostgresBackend) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE query = $1 AND datname = current_database() LIMIT 1",
    )
    .bind(format!("LISTEN \"relayq_{}\"", b.schema()))
    .fetch_optional(b.pool())
    .await
    .unwrap()
}

/// Four tasks migrate one new schema at once, then it is migrated twice more: no
/// error, and each migration is recorded once.
async fn migrations_run_concurrently_and_repeatedly(url: String) {
    let schema = format!(
        "relayq_t_mig_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let backends = join_all((0..4).map(|_| {
        let config = Config::default().with_schema(schema.clone());
        PostgresBackend::connect_with(&url, config)
    }))
    .await;
    let backends: Vec<PostgresBackend> = backends.into_iter().map(Result::unwrap).collect();
    let results = join_all(backends.iter().map(PostgresBackend::migrate)).await;
    for r in results {
        r.expect("concurrent migrate");
    }
    backends[0].migrate().await.unwrap();
    backends[1].migrate().await.unwrap();
    let sql = format!("SELECT count(*) FROM \"{schema}\".migrations");
    let versions: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(backends[0].pool())
        .await
        .unwrap();
    assert_eq!(
        versions,
        i64::try_from(relayq_postgres::SCHEMA_VERSION).unwrap()
    );
    let q = queue_name("mig");
    backends[2]
        .enqueue_one(NewJob::new(&q, vec![]))
        .await
        .unwrap();
    drop_schema(&backends[0]).await;
}

/// `enqueue_in`: jobs exist only if the caller's transaction commits.
async fn enqueue_in_follows_the_callers_transaction(url: String) {
    let b = fresh(&url, "txn").await;
    let q = queue_name("txn");

    let mut tx = b.pool().begin().await.unwrap();
    let gone = b.enqueue_in(&mut tx, jobs(&q, 2)).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(
        b.job(&q, gone[0].id).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(b.queue_stats(&q).await.unwrap().total(), 0);

    let mut tx = b.pool().begin().await.unwrap();
    let kept = b.enqueue_in(&mut tx, jobs(&q, 2)).await.unwrap();
    // Not claimable before the commit.
    assert!(
        b.claim(ClaimRequest::new(&q, "w", 10, LEASE))
            .await
            .unwrap()
            .is_empty()
    );
    tx.commit().await.unwrap();
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    let got: Vec<_> = got.iter().map(|j| j.lease.job).collect();
    assert_eq!(got, vec![kept[0].id, kept[1].id]);
    drop_schema(&b).await;
}

/// A failed `enqueue_in` undoes only its own writes: the caller's transaction stays
/// usable, and what it did before is kept when it commits.
async fn failed_enqueue_in_leaves_the_callers_transaction_usable(url: String) {
    let b = fresh(&url, "txnerr").await;
    let q = queue_name("txnerr");
    let batch = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    b.seal(&batch).await.unwrap();

    let mut tx = b.pool().begin().await.unwrap();
    let first = b.enqueue_in(&mut tx, jobs(&q, 1)).await.unwrap();
    let sealed = NewJob::new(&q, vec![]).in_batch(batch.id, 1);
    let err = b
        .enqueue_in(&mut tx, vec![NewJob::new(&q, vec![]), sealed])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { field: "batch", .. }),
        "{err}"
    );
    let second = b.enqueue_in(&mut tx, jobs(&q, 1)).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(b.queue_stats(&q).await.unwrap().count(JobState::Ready), 2);
    b.job(&q, first[0].id).await.unwrap();
    b.job(&q, second[0].id).await.unwrap();
    drop_schema(&b).await;
}

/// A migration lock timeout PostgreSQL cannot take (0 would mean no limit at all) is
/// refused by name, before any connection is made.
async fn out_of_range_migrate_lock_timeouts_are_refused() {
    for bad in [Duration::ZERO, Duration::from_secs(30 * 24 * 3600)] {
        let config = Config::default().with_migrate_lock_timeout(bad);
        let err = PostgresBackend::connect_with("postgres://postgres@127.0.0.1:1/test", config)
            .await
            .unwrap_err();
        assert_eq!(
            err.invalid_field(),
            Some("migrate_lock_timeout"),
            "{bad:?}: {err}"
        );
    }
}

/// Connection failures are `Backend` errors, never panics: a server that does not
/// answer; bad URLs and schemas are `InvalidInput`.
async fn connection_failures_are_backend_errors() {
    let quick = Config::default().with_acquire_timeout(Duration::from_millis(500));
    let err = PostgresBackend::connect_with("postgres://postgres@127.0.0.1:1/test", quick)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let err = PostgresBackend::connect("mysql://nope").await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { field: "url", .. }),
        "{err}"
    );
    let err = PostgresBackend::connect_with(
        "postgres://postgres@127.0.0.1:1/test",
        Config::default().with_schema("Bad-Name"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "schema",
                ..
            }
        ),
        "{err}"
    );
}

/// A pool closed under a live backend gives `Backend` errors, never panics.
async fn a_closed_pool_gives_backend_errors(url: String) {
    let b = fresh(&url, "closed").await;
    let q = queue_name("closed");
    b.pool().close().await;
    let err = b.enqueue_one(NewJob::new(&q, vec![])).await.unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let err = b
        .claim(ClaimRequest::new(&q, "w", 1, LEASE))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let other = second_handle(&url, &b).await;
    drop_schema(&other).await;
}

/// SPEC L1: a settle whose token no longer matches does not lock the job's row: it answers
/// `StaleLease` at once while another transaction holds that row, instead of waiting
/// for it (and, in a settle of many leases, holding locks it will not use meanwhile).
async fn stale_settle_does_not_wait_for_a_locked_row(url: String) {
    let b = fresh(&url, "stalelock").await;
    let q = queue_name("stalelock");
    b.enqueue(jobs(&q, 1)).await.unwrap();
    let claimed = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
    let lease = claimed[0].lease.clone();
    let mut holder = b.pool().begin().await.unwrap();
    let lock = format!(
        "SELECT id FROM \"{}\".jobs WHERE id = $1 FOR UPDATE",
        b.schema()
    );
    sqlx::query(sqlx::AssertSqlSafe(lock))
        .bind(lease.job.0)
        .execute(&mut *holder)
        .await
        .unwrap();
    let stale = Lease {
        token: LeaseToken::random(),
        ..lease.clone()
    };
    let settled = tokio::time::timeout(
        Duration::from_secs(10),
        b.settle_many(vec![Settle::complete(stale)]),
    )
    .await
    .expect("the stale settle waited for the row lock")
    .unwrap();
    assert!(matches!(settled[0], Err(Error::StaleLease)), "{settled:?}");
    holder.rollback().await.unwrap();
    let done = b.settle_many(vec![Settle::complete(lease)]).await.unwrap();
    assert!(done[0].is_ok(), "{done:?}");
    drop_schema(&b).await;
}

/// More `min_connections` than `max_connections` is refused before any connection is
/// made.
async fn more_min_than_max_connections_is_refused() {
    let err = PostgresBackend::connect_with(
        "postgres://postgres@127.0.0.1:1/test",
        Config::default()
            .with_max_connections(4)
            .with_min_connections(5),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "min_connections",
                ..
            }
        ),
        "{err}"
    );
}

/// `min_connections` are open when `connect_with` returns, so a worker's first claims
/// and settles do not wait for connection set-up.
async fn min_connections_are_open_on_return(url: String) {
    let warm = Config::default()
        .with_max_connections(8)
        .with_min_connections(6);
    let b = PostgresBackend::connect_with(&url, warm).await.unwrap();
    assert!(b.pool().size() >= 6, "pool size {}", b.pool().size());
    let cold = PostgresBackend::connect_with(&url, Config::default())
        .await
        .unwrap();
    assert!(cold.pool().size() < 6, "pool size {}", cold.pool().size());
}

/// Jobs with a group (or batch, or dedupe key) need READ COMMITTED: a REPEATABLE READ
/// snapshot would hide the running holder of the group. Plain jobs are fine anywhere.
async fn enqueue_in_needs_read_committed_for_groups(url: String) {
    let b = fresh(&url, "iso").await;
    let q = queue_name("iso");
    let mut tx = b
        .pool()
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let err = b
        .enqueue_in(&mut tx, vec![NewJob::new(&q, vec![]).group("g")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "transaction",
                ..
            }
        ),
        "{err}"
    );
    let plain = b.enqueue_in(&mut tx, jobs(&q, 1)).await.unwrap();
    tx.commit().await.unwrap();
    b.job(&q, plain[0].id).await.unwrap();
    assert_eq!(b.queue_stats(&q).await.unwrap().total(), 1);
    drop_schema(&b).await;
}

/// A second handle on `setup`'s schema whose pool has one connection, so that every
/// statement made through it runs in one session.
async fn one_connection(url: &str, setup: &PostgresBackend) -> PostgresBackend {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    PostgresBackend::from_pool(pool, &Config::default().with_schema(setup.schema())).unwrap()
}

/// The session's value of `setting`, read with `current_setting`.
async fn show(b: &PostgresBackend, setting: &str) -> String {
    sqlx::query_scalar::<_, String>("SELECT current_setting($1)")
        .bind(setting)
        .fetch_one(b.pool())
        .await
        .unwrap()
}

/// A claim turns `synchronous_commit` off for its own transaction only (see
/// `Config::durable_claims`): the enqueues and settles that follow on the same pooled
/// connection still wait for their flush, whichever claim path ran.
async fn claims_leave_the_sessions_commit_setting_as_it_was(url: String) {
    let setup = fresh(&url, "synccommit").await;
    // One connection, so every statement below runs on the one the claims used.
    let b = one_connection(&url, &setup).await;
    let show = || show(&b, "synchronous_commit");
    let before = show().await;
    assert_ne!(
        before, "off",
        "the server's own setting is off: nothing to see"
    );
    let q = queue_name("synccommit");
    b.enqueue(jobs(&q, 2)).await.unwrap();
    // The unlimited path: one statement in its own transaction.
    let got = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(show().await, before, "after a claim");
    // The limited path: the claim statement inside the queue lock's transaction.
    b.set_max_running(&q, Some(5)).await.unwrap();
    let got = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(show().await, before, "after a claim of a limited queue");
    drop_schema(&setup).await;
}

/// A settle's statements run generic plans from their first run (no five custom
/// plannings per connection on a stage transition's path), through a `SET LOCAL` that
/// ends with the transaction: the session's `plan_cache_mode` is left as it was.
async fn settles_plan_generically_and_leave_the_sessions_plan_mode_as_it_was(url: String) {
    let setup = fresh(&url, "genericplan").await;
    // One connection, so the settles and the look-ups below share one session.
    let b = one_connection(&url, &setup).await;
    let mode = || show(&b, "plan_cache_mode");
    let before = mode().await;
    assert_eq!(
        before, "auto",
        "the server's own setting is not the default"
    );
    // Two stages, so that the settles below lock the batch and release stage 2.
    let q = queue_name("genericplan");
    let batch = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    let staged = (1..=2)
        .flat_map(|stage| (0..2).map(move |_| stage))
        .map(|stage| NewJob::new(&q, vec![]).in_batch(batch.id, stage))
        .collect();
    b.enqueue(staged).await.unwrap();
    b.seal(&batch).await.unwrap();
    // Enqueue and seal lock the batch with the same statement, outside any settle.
    let plans = || async {
        sqlx::query_as::<_, (String, i64, i64)>(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
        )
        .fetch_all(b.pool())
        .await
        .unwrap()
    };
    let of = |plans: &[(String, i64, i64)], needle: &str| {
        plans
            .iter()
            .find(|p| p.0.contains(needle))
            .map_or((0, 0), |p| (p.1, p.2))
    };
    // The settle statement, the batch lock, and the release of the next stage.
    let needles = [
        "WITH ORDINALITY AS i(id, token",
        "WITH locked AS",
        "raised AS (",
    ];
    let start = plans().await;
    for _ in 0..2 {
        let got = b.claim(ClaimRequest::new(&q, "w", 2, LEASE)).await.unwrap();
        assert_eq!(got.len(), 2, "each stage's two jobs are claimable in turn");
        let done = got.into_iter().map(|j| Settle::complete(j.lease)).collect();
        for settled in b.settle_many(done).await.unwrap() {
            settled.unwrap();
        }
        assert_eq!(mode().await, before, "after a settle");
    }
    let end = plans().await;
    for needle in needles {
        let ((g0, c0), (g1, c1)) = (of(&start, needle), of(&end, needle));
        assert_eq!(c1, c0, "settles planned {needle:?} for their parameters");
        assert!(g1 > g0, "no settle ran {needle:?}: {end:?}");
    }
    drop_schema(&setup).await;
}

/// A backend on a new schema at version 1, as relayq-postgres 0.1 created it, not
/// migrated further; and the schema's quoted name.
async fn version_1(url: &str) -> (PostgresBackend, String) {
    let schema = format!(
        "relayq_t_v1_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let b = PostgresBackend::connect_with(url, Config::default().with_schema(schema.clone()))
        .await
        .unwrap();
    let s = format!("\"{schema}\"");
    run_sql(
        &b,
        format!(
            "CREATE SCHEMA {s};
             CREATE TABLE {s}.migrations (version integer PRIMARY KEY,
                                          applied_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO {s}.migrations (version) VALUES (1);"
        ),
    )
    .await;
    run_sql(
        &b,
        include_str!("../migrations/0001_init.sql").replace("{s}", &s),
    )
    .await;
    (b, s)
}

/// A schema never migrated, or migrated by an older version, fails with an error that
/// says to run `migrate()`, not only PostgreSQL's missing relation or column.
async fn unmigrated_schemas_say_to_migrate(url: String) {
    let none = PostgresBackend::connect_with(
        &url,
        Config::default().with_schema(format!(
            "relayq_t_none_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )),
    )
    .await
    .unwrap();
    let q = queue_name("unmigrated");
    let err = none
        .claim(ClaimRequest::new(&q, "w", 1, LEASE))
        .await
        .unwrap_err();
    // A typed schema error naming the schema, not a driver error to read.
    assert!(
        matches!(&err, Error::Schema { schema, state: relayq_core::SchemaState::Missing, .. }
            if schema == none.schema()),
        "{err:?}"
    );
    assert!(err.to_string().contains("migrate()"), "{err}");
    // Version 1: claims need version 4's function. The failed claim changed nothing.
    let (old, s) = version_1(&url).await;
    // Stored as version 1 stored jobs: today's enqueue writes later columns.
    let id = relayq_core::JobId(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.jobs (queue, state, payload, priority, run_at, max_attempts,
                                   created_at)
             VALUES ($1, 'ready', '', 0, now(), 3, now()) RETURNING id"
        )))
        .bind(&q)
        .fetch_one(old.pool())
        .await
        .unwrap(),
    );
    let err = old
        .claim(ClaimRequest::new(&q, "w", 1, LEASE))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Schema {
                state: relayq_core::SchemaState::Older,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("run migrate()"), "{err}");
    let state_of = |id: relayq_core::JobId| {
        let (pool, sql) = (
            old.pool().clone(),
            format!("SELECT state FROM {s}.jobs WHERE id = $1"),
        );
        async move {
            let state: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(id.0)
                .fetch_one(&pool)
                .await
                .unwrap();
            state
        }
    };
    assert_eq!(state_of(id).await, "ready");
    // A job that a process of version 1 claimed: a completion, and reading the job,
    // need version 2's columns. The failed completion changed nothing.
    let token = LeaseToken::random();
    let expires_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.jobs SET state = 'running', attempts = 1, lease_token = $2,
             lease_expires_at = now() + interval '30 seconds', worker = 'w',
             started_at = now()
         WHERE id = $1 RETURNING lease_expires_at"
        )))
        .bind(id.0)
        .bind(token.0)
        .fetch_one(old.pool())
        .await
        .unwrap();
    let lease = Lease {
        queue: q.clone(),
        job: id,
        token,
        attempt: 1,
        expires_at,
        worker: "w".into(),
    };
    let err = old.complete(&lease).await.unwrap_err();
    assert!(err.to_string().contains("run migrate()"), "{err}");
    let err = old.job(&q, id).await.unwrap_err();
    assert!(err.to_string().contains("run migrate()"), "{err}");
    assert_eq!(state_of(id).await, "running");
    // Once migrated, the same lease completes.
    old.migrate().await.unwrap();
    old.complete(&lease).await.unwrap();
    drop_schema(&old).await;
}

/// Schema version 2 keeps a succeeded attempt on its `finished` row, not in `attempts`.
/// A job finished under version 1, with that attempt in `attempts`, reads the same log
/// after the upgrade; a job finished after it has one `attempts` row less.
async fn succeeded_attempts_read_the_same_across_the_upgrade(url: String) {
    let (b, s) = version_1(&url).await;
    let exec = |sql: String| run_sql(&b, sql);
    let q = queue_name("v1");
    exec(format!(
        "INSERT INTO {s}.finished (id, queue, state, payload, priority, run_at, max_attempts,
                                   attempts, created_at, finished_at)
         VALUES (7, '{q}', 'succeeded', '\\x00', 0, now(), 3, 2, now(), now());
         INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome,
                                   error, output)
         VALUES (7, 1, 'old', now(), now(), 'failed', 'boom', NULL),
                (7, 2, 'old', now(), now(), 'succeeded', NULL, 'done then');"
    ))
    .await;
    b.migrate().await.unwrap();
    let old = b.job(&q, relayq_core::JobId(7)).await.unwrap();
    let outcomes: Vec<_> = old
        .attempt_log
        .iter()
        .map(|a| (a.attempt, a.outcome, a.output.clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (1, relayq_core::AttemptOutcome::Failed, None),
            (
                2,
                relayq_core::AttemptOutcome::Succeeded,
                Some("done then".into())
            ),
        ]
    );
    // A job finished now: same log, its success on the finished row.
    let id = b.enqueue_one(NewJob::new(&q, vec![1])).await.unwrap().id;
    let first = b
        .claim(ClaimRequest::new(&q, "w1", 1, LEASE))
        .await
        .unwrap();
    b.settle_many(vec![Settle::fail(
        first[0].lease.clone(),
        "boom",
        relayq_core::Retry::At(chrono::Utc::now()),
    )])
    .await
    .unwrap()
    .remove(0)
    .unwrap();
    let second = poll_until("the retry is claimable", Duration::from_secs(5), || async {
        let got = b.claim(ClaimRequest::new(&q, "w2", 1, LEASE)).await?;
        Ok((!got.is_empty()).then_some(got))
    })
    .await
    .unwrap();
    b.settle_many(vec![
        Settle::complete(second[0].lease.clone()).with_output(Some("done now".into())),
    ])
    .await
    .unwrap()
    .remove(0)
    .unwrap();
    let new = b.job(&q, id).await.unwrap();
    let log: Vec<_> = new
        .attempt_log
        .iter()
        .map(|a| (a.attempt, a.worker.as_str(), a.outcome, a.output.clone()))
        .collect();
    assert_eq!(
        log,
        [
            (1, "w1", relayq_core::AttemptOutcome::Failed, None),
            (
                2,
                "w2",
                relayq_core::AttemptOutcome::Succeeded,
                Some("done now".into())
            ),
        ]
    );
    let done = &new.attempt_log[1];
    assert_eq!(done.ended_at, new.finished_at);
    assert!(done.started_at <= new.finished_at.unwrap());
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.attempts WHERE job_id = $1"
    )))
    .bind(id.0)
    .fetch_one(b.pool())
    .await
    .unwrap();
    assert_eq!(rows, 1, "only the failed attempt has a row of its own");
    drop_schema(&b).await;
}

/// A migration whose table stays locked gives up after the configured wait with an
/// error that says so, changes nothing, and succeeds once the lock is gone (instead of
/// queueing every claim and settle behind its lock for as long as the holder runs).
async fn migrate_gives_up_on_a_locked_table_and_changes_nothing(url: String) {
    let (b, s) = version_1(&url).await;
    let impatient = PostgresBackend::connect_with(
        &url,
        Config::default()
            .with_schema(s.trim_matches('"'))
            .with_migrate_lock_timeout(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let version = async || -> i32 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT max(version) FROM {s}.migrations"
        )))
        .fetch_one(b.pool())
        .await
        .unwrap()
    };
    // A long transaction reading `finished`, which migration 2 alters.
    let mut holder = b.pool().begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {s}.finished IN ACCESS SHARE MODE"
    )))
    .execute(&mut *holder)
    .await
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), impatient.migrate())
        .await
        .expect("migrate waited on the lock instead of giving up")
        .unwrap_err();
    assert!(err.to_string().contains("stayed locked"), "{err}");
    assert_eq!(version().await, 1);
    holder.rollback().await.unwrap();
    impatient.migrate().await.unwrap();
    assert_eq!(
        usize::try_from(version().await).unwrap(),
        relayq_postgres::SCHEMA_VERSION
    );
    drop_schema(&b).await;
}

/// Leases settle the same from a handle that did not claim them (it knows nothing of
/// their groups): in one call with a plain lease and a stale one, the grouped job's
/// completion releases its group's next job, and every answer is right. (A settle
/// that first tried an autocommit statement for leases that release nothing gained about
/// 1%, inside the spread, and was not kept; this is the case it had to get right.)
async fn settles_from_another_handle_still_release_groups(url: String) {
    let claimer = fresh(&url, "handoff").await;
    let settler = PostgresBackend::connect_with(
        &url,
        Config::default().with_schema(claimer.schema().to_owned()),
    )
    .await
    .unwrap();
    let q = queue_name("handoff");
    let grouped = |n: u8| NewJob::new(&q, vec![n]).group("g");
    let ids: Vec<_> = claimer
        .enqueue(vec![grouped(1), grouped(2), NewJob::new(&q, vec![3])])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let got = claimer
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    let held: Vec<_> = got.iter().map(|j| j.lease.job).collect();
    assert_eq!(held, [ids[0], ids[2]], "the group's second job waits");
    let stale = Lease {
        token: LeaseToken::random(),
        ..got[1].lease.clone()
    };
    let results = settler
        .settle_many(vec![
            Settle::complete(stale),
            Settle::complete(got[0].lease.clone()),
            Settle::complete(got[1].lease.clone()),
        ])
        .await
        .unwrap();
    assert!(
        matches!(
            results.as_slice(),
            [
                Err(Error::StaleLease),
                Ok(relayq_core::Settled::Completed),
                Ok(relayq_core::Settled::Completed)
            ]
        ),
        "{results:?}"
    );
    for id in [ids[0], ids[2]] {
        assert_eq!(
            settler.job(&q, id).await.unwrap().state,
            JobState::Succeeded
        );
    }
    let next = claimer
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(next.len(), 1, "the group's next job was released");
    assert_eq!(next[0].lease.job, ids[1]);
    drop_schema(&claimer).await;
}

/// Waits up to 5 s for a `kind` event of `queue` on `rx`, skipping others.
async fn expect_event(
    rx: &mut tokio::sync::broadcast::Receiver<relayq_core::Event>,
    queue: &str,
    kind: EventKind,
    what: &str,
) {
    let wait = async {
        loop {
            let ev = rx.recv().await.expect("events");
            if ev.kind == kind && *ev.queue == *queue {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .unwrap_or_else(|_| panic!("no {kind:?} event for {what}"));
}

/// Returns once the listener behind `events` hears `b`'s enqueues (in a queue of its
/// own, so the caller's jobs are claimed alone).
/// Another handle (its own pool and listener) on `b`'s schema, as a second process
/// would open it.
async fn second_handle(url: &str, b: &PostgresBackend) -> PostgresBackend {
    PostgresBackend::connect_with(url, Config::default().with_schema(b.schema()))
        .await
        .unwrap()
}

async fn listening(
    b: &PostgresBackend,
    events: &mut tokio::sync::broadcast::Receiver<relayq_core::Event>,
) {
    let warm = queue_name("notify_warm");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        b.enqueue_one(NewJob::new(&warm, b"warm".to_vec()))
            .await
            .unwrap();
        let heard = tokio::time::timeout(Duration::from_millis(200), async {
            loop {
                let ev = events.recv().await.expect("events");
                if ev.kind == EventKind::Ready && *ev.queue == *warm {
                    return;
                }
            }
        })
        .await;
        if heard.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other handle's listener never heard an enqueue"
        );
    }
}

/// SPEC W2: a plain enqueue, which notifies right after its commit rather than inside
/// it, still wakes another handle, and the job is claimable once the event is heard.
async fn plain_enqueue_wakes_other_handles(url: String) {
    let b = fresh(&url, "pnotify").await;
    let other = second_handle(&url, &b).await;
    let mut events = other.subscribe().unwrap();
    listening(&b, &mut events).await;
    let q = queue_name("pnotify");
    b.enqueue_one(NewJob::new(&q, b"x".to_vec())).await.unwrap();
    expect_event(&mut events, &q, EventKind::Ready, "a plain enqueue").await;
    let got = other
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the job announced is claimable");
    drop_schema(&b).await;
}

/// SPEC G2, W2: a settle that gives a group its next holder tells other handles that a
/// job is ready, and so do the settle's other ready notifications, which are sent in
/// the same call as the group's (migration 0005): here a released job of another queue.
async fn group_settles_notify_other_handles(url: String) {
    let b = fresh(&url, "gnotify").await;
    let other = second_handle(&url, &b).await;
    let mut events = other.subscribe().unwrap();
    let (grouped, plain) = (queue_name("gnotify"), queue_name("gnotify_plain"));
    listening(&b, &mut events).await;
    let g = |n: u8| NewJob::new(&grouped, vec![n]).group("g");
    b.enqueue(vec![g(1), g(2)]).await.unwrap();
    b.enqueue_one(NewJob::new(&plain, vec![3])).await.unwrap();
    let first = b
        .claim(ClaimRequest::new(&grouped, "w", 10, LEASE))
        .await
        .unwrap();
    let released = b
        .claim(ClaimRequest::new(&plain, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(
        (first.len(), released.len()),
        (1, 1),
        "one holder, one plain job"
    );
    // The earlier ready events are in once a later one is heard (one listener gets
    // notifications in commit order), and are cleared with it.
    listening(&b, &mut events).await;
    while events.try_recv().is_ok() {}
    let results = b
        .settle_many(vec![
            Settle::complete(first[0].lease.clone()),
            Settle::release(released[0].lease.clone()),
        ])
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Both, in either order.
    let mut waiting = vec![grouped.clone(), plain.clone()];
    tokio::time::timeout(Duration::from_secs(5), async {
        while !waiting.is_empty() {
            let ev = events.recv().await.expect("events");
            if ev.kind == EventKind::Ready {
                waiting.retain(|q| **q != *ev.queue);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no ready event for {waiting:?}"));
    let next = other
        .claim(ClaimRequest::new(&grouped, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(next.len(), 1, "the group's second job is ready");
    assert_eq!(next[0].payload, [2]);
    drop_schema(&b).await;
}

/// SPEC B5, W2: settles of batch jobs notify other handles that jobs finished, and,
/// when a stage is released, that jobs are ready. The finished notification goes out
/// with the settle statement, the ready one after promotion; this checks none is lost.
async fn batch_settles_notify_other_handles(url: String) {
    let b = fresh(&url, "notify").await;
    let other = second_handle(&url, &b).await;
    let mut events = other.subscribe().unwrap();
    let q = queue_name("notify");
    listening(&b, &mut events).await;
    let batch = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    let staged = [1, 1, 2]
        .map(|s| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, s))
        .to_vec();
    b.enqueue(staged).await.unwrap();
    let claimed = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    let first: Vec<_> = claimed.iter().filter(|j| j.stage == Some(1)).collect();
    assert_eq!(
        (first.len(), claimed.len()),
        (2, 2),
        "the two stage-1 jobs alone claimed: {claimed:?}"
    );
    // The earlier ready events are in once a later one is heard (one listener gets
    // notifications in commit order), and are cleared with it.
    listening(&b, &mut events).await;
    while events.try_recv().is_ok() {}
    b.complete(&first[0].lease).await.unwrap();
    expect_event(&mut events, &q, EventKind::Finished, "a batch job's settle").await;
    b.complete(&first[1].lease).await.unwrap();
    expect_event(&mut events, &q, EventKind::Ready, "the released stage").await;
    drop_schema(&b).await;
}

/// The statements that give a group its next holder ask the holder index whether a job
/// of the group is running and which of its jobs are ready, in both plans, after
/// `ANALYZE`: through the group index, each question read every unfinished job of the
/// group, on every settle of a grouped job.
async fn group_holder_plans_use_the_holder_index_after_analyze(url: String) {
    let b = fresh(&url, "holderplan").await;
    let q = queue_name("holderplan");
    for g in 0..20 {
        let grouped = jobs(&q, 200).into_iter().map(|j| j.group(format!("g{g}")));
        b.enqueue(grouped.collect()).await.unwrap();
    }
    analyze(&b).await;
    for generic in [false, true] {
        let (heads, promote) = b.explain_group_holders(generic).await.unwrap();
        // `busy` (an InitPlan or SubPlan of CTE st) and the demotion's scan (alone, or
        // in a BitmapAnd); the group index only for the head, read in order.
        assert!(
            heads.matches("jobs_holder").count() >= 2 && heads.matches("jobs_group").count() == 1,
            "generic={generic}:\n{heads}"
        );
        assert!(
            promote.contains("jobs_holder") && !promote.contains("jobs_group"),
            "generic={generic}:\n{promote}"
        );
        for plan in [&heads, &promote] {
            assert!(
                !plan.contains("Seq Scan on jobs"),
                "generic={generic}:\n{plan}"
            );
        }
    }
    drop_schema(&b).await;
}

/// The README's way to upgrade a large `jobs` table: the holder index made
/// `CONCURRENTLY` beforehand, under the migration's name and definition; `migrate` then
/// takes it as it is and reaches the current version. A build of that kind that failed
/// leaves an invalid index (here marked so in the catalog), which `migrate` builds again.
async fn migrate_keeps_a_holder_index_made_beforehand(url: String) {
    for failed_build in [false, true] {
        let (b, s) = version_1(&url).await;
        let index = include_str!("../migrations/0003_group_holder.sql");
        let index = &index[index.find("CREATE INDEX").unwrap()..];
        let index = index
            .replace("CREATE INDEX IF NOT EXISTS", "CREATE INDEX CONCURRENTLY")
            .replace("{s}", &s);
        run_sql(&b, index).await;
        if failed_build {
            run_sql(
                &b,
                format!(
                    "UPDATE pg_index SET indisvalid = false
                     WHERE indexrelid = to_regclass('{s}.jobs_holder')"
                ),
            )
            .await;
        }
        b.migrate().await.unwrap();
        let (version, valid): (i32, Vec<bool>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT max(version) FROM {s}.migrations),
                    ARRAY(SELECT i.indisvalid FROM pg_index i JOIN pg_class c
                          ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE n.nspname = '{}' AND c.relname = 'jobs_holder')",
            b.schema()
        )))
        .fetch_one(b.pool())
        .await
        .unwrap();
        assert_eq!(
            usize::try_from(version).unwrap(),
            relayq_postgres::SCHEMA_VERSION
        );
        assert_eq!(valid, [true], "failed_build={failed_build}");
        drop_schema(&b).await;
    }
}

/// SPEC M3: while another pass over the queue holds the maintenance lock,
/// `try_maintain` returns `None` at once and deletes nothing; once it is free, the pass
/// runs. The lock is the documented advisory lock, taken here by hand.
async fn try_maintain_skips_while_another_pass_holds_the_lock(url: String) {
    let b = fresh(&url, "m3lock").await;
    let q = queue_name("m3lock");
    let ids = b.enqueue(jobs(&q, 2)).await.unwrap();
    for e in &ids {
        assert!(b.cancel_job(&q, e.id).await.unwrap());
    }
    let mut holder = b.pool().begin().await.unwrap();
    let locked: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(b.maintenance_lock_key(&q))
            .fetch_one(&mut *holder)
            .await
            .unwrap();
    assert!(locked, "the test could not take the lock");
    let skipped = tokio::time::timeout(Duration::from_secs(5), b.try_maintain(&q, Duration::ZERO))
        .await
        .expect("try_maintain waited for the lock")
        .unwrap();
    assert_eq!(skipped, None, "a pass ran while another held the lock");
    assert_eq!(
        b.queue_stats(&q).await.unwrap().total(),
        2,
        "jobs were pruned"
    );
    // Another queue's pass is not held up by this queue's lock.
    let other = queue_name("m3other");
    assert!(
        b.try_maintain(&other, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
    );
    holder.rollback().await.unwrap();
    let ran = b.try_maintain(&q, Duration::ZERO).await.unwrap();
    assert_eq!(
        ran.map(|m| m.pruned),
        Some(2),
        "the pass after the lock was freed"
    );
    drop_schema(&b).await;
}

/// `check_schema` (what read-only tools run instead of `migrate`) says whether the
/// schema is missing or old, and passes on a migrated one, changing nothing.
async fn check_schema_says_missing_old_or_fine(url: String) {
    let none = PostgresBackend::connect_with(
        &url,
        Config::default().with_schema(format!(
            "relayq_t_chk_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )),
    )
    .await
    .unwrap();
    let err = none.check_schema().await.unwrap_err();
    assert!(
        matches!(
            err,
            relayq_core::Error::Schema {
                state: relayq_core::SchemaState::Missing,
                ..
            }
        ),
        "{err}"
    );
    let err = err.to_string();
    assert!(err.contains("holds no relayq tables"), "{err}");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(none.schema())
            .fetch_one(none.pool())
            .await
            .unwrap();
    assert!(!exists, "check_schema created the schema");
    let (old, _) = version_1(&url).await;
    let err = old.check_schema().await.unwrap_err().to_string();
    assert!(
        err.contains("at version 1") && err.contains("migrate()"),
        "{err}"
    );
    drop_schema(&old).await;
    let b = fresh(&url, "chk").await;
    b.check_schema().await.unwrap();
    drop_schema(&b).await;
}

/// SPEC S2: a scheduler that holds a schedule's row in an open transaction (a slot
/// being fired, or a frozen process mid-fire) makes another scheduler move on at once,
/// firing nothing; once it rolls back, the slot fires, once.
async fn s2_a_schedule_held_elsewhere_is_skipped_not_waited_for(url: String) {
    use relayq_core::{
        Schedules,
        schedule::{Fired, Schedule},
    };
    let b = fresh(&url, "s2held").await;
    let q = queue_name("s2held");
    let start = chrono::Utc::now() - chrono::TimeDelta::seconds(3);
    b.put_schedule(
        &Schedule::new(&q, "tick", "* * * * * *")
            .starting(start)
            .job(NewJob::new(&q, b"x".to_vec())),
    )
    .await
    .unwrap();
    let mut holder = b.pool().begin().await.unwrap();
    let sql = format!(
        "SELECT mark FROM \"{}\".schedules WHERE queue = $1 FOR UPDATE",
        b.schema()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&q)
        .execute(&mut *holder)
        .await
        .unwrap();
    let pass = tokio::time::timeout(Duration::from_secs(10), b.run_schedules(&q))
        .await
        .expect("the scheduler waited for the held row")
        .unwrap();
    assert!(
        pass.fired.is_empty(),
        "fired under another's lock: {:?}",
        pass.fired
    );
    assert_eq!(b.queue_stats(&q).await.unwrap().total(), 0);
    holder.rollback().await.unwrap();
    let pass = b.run_schedules(&q).await.unwrap();
    assert_eq!(pass.fired.len(), 1, "latest: one slot once the row is free");
    assert!(matches!(pass.fired[0].2, Fired::Made { .. }));
    assert_eq!(b.queue_stats(&q).await.unwrap().total(), 1);
    drop_schema(&b).await;
}

/// SPEC K12: a maintenance pass drops the rows of keys under the default key rate
/// whose value lies in the past (the same as none), and keeps a key's own rate and a
/// value still ahead.
async fn maintenance_drops_spent_key_rate_rows(url: String) {
    let b = fresh(&url, "krprune").await;
    let q = queue_name("krprune");
    let fast = relayq_core::Rate::new(1000, Duration::from_secs(1));
    let slow = relayq_core::Rate::new(1, Duration::from_secs(3600));
    b.set_key_rate(&q, None, Some(fast)).await.unwrap();
    b.set_key_rate(&q, Some("own"), Some(slow)).await.unwrap();
    let keyed = ["a", "b", "own"].map(|k| NewJob::new(&q, b"x".to_vec()).limit_key(k));
    b.enqueue(keyed.to_vec()).await.unwrap();
    assert_eq!(
        b.claim(ClaimRequest::new(&q, "w", 10, LEASE))
            .await
            .unwrap()
            .len(),
        3
    );
    let rows = |b: PostgresBackend, q: String| async move {
        let sql = format!(
            "SELECT limit_key FROM \"{}\".key_rates WHERE queue = $1 ORDER BY 1",
            b.schema()
        );
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
            .bind(q)
            .fetch_all(b.pool())
            .await
            .unwrap()
    };
    assert_eq!(rows(b.clone(), q.clone()).await, ["a", "b", "own"]);
    // Under 1,000 a second a key's value is a millisecond ahead.
    poll_until(
        "the fast keys' values to pass",
        Duration::from_secs(5),
        || {
            let (b, q) = (b.clone(), q.clone());
            async move {
                b.maintain(&q, Duration::from_secs(3600)).await?;
                Ok((rows(b, q).await == ["own"]).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    drop_schema(&b).await;
}

relayq_conformance::server_tests! {
    server: common::SERVER,
    tests: [
        s2_a_schedule_held_elsewhere_is_skipped_not_waited_for,
        try_maintain_skips_while_another_pass_holds_the_lock,
        check_schema_says_missing_old_or_fine,
        c4_claim_skips_a_row_locked_elsewhere,
        bug_15715_claims_never_exceed_their_limit,
        claim_plans_use_the_claim_index_after_analyze,
        a_claim_reads_only_its_queues_head_with_or_without_statistics,
        settle_plans_find_leases_by_id_after_analyze,
        killed_listener_reconnects_and_wakes_workers,
        migrations_run_concurrently_and_repeatedly,
        enqueue_in_follows_the_callers_transaction,
        failed_enqueue_in_leaves_the_callers_transaction_usable,
        stale_settle_does_not_wait_for_a_locked_row,
        a_closed_pool_gives_backend_errors,
        min_connections_are_open_on_return,
        enqueue_in_needs_read_committed_for_groups,
        claims_leave_the_sessions_commit_setting_as_it_was,
        settles_plan_generically_and_leave_the_sessions_plan_mode_as_it_was,
        unmigrated_schemas_say_to_migrate,
        succeeded_attempts_read_the_same_across_the_upgrade,
        migrate_gives_up_on_a_locked_table_and_changes_nothing,
        settles_from_another_handle_still_release_groups,
        plain_enqueue_wakes_other_handles,
        group_settles_notify_other_handles,
        batch_settles_notify_other_handles,
        group_holder_plans_use_the_holder_index_after_analyze,
        migrate_keeps_a_holder_index_made_beforehand,
        maintenance_drops_spent_key_rate_rows,
    ],
    local: [
        more_min_than_max_connections_is_refused,
        out_of_range_migrate_lock_timeouts_are_refused,
        connection_failures_are_backend_errors,
    ],
}
