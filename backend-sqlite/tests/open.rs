//! Opening one new file from many handles at once: WAL switch and migrations must not
//! race (each ran into "database is locked" / "table already exists" before).

use relayq_core::Inspect;
use relayq_core::{CompleteExt, EnqueueExt};
use relayq_sqlite::SqliteBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_handles_open_a_new_file_at_once() {
    for round in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
        let opens: Vec<_> = (0..32)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { SqliteBackend::open(&url).await })
            })
            .collect();
        for open in opens {
            let backend = open
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(backend.queue_stats("q").await.unwrap().total(), 0);
        }
    }
}

/// A database made by schema version 1 is upgraded in place on open, keeping its jobs.
#[tokio::test]
async fn a_version_1_database_is_upgraded_on_open() {
    use relayq_core::{Claim, ClaimRequest, JobId, NewJob, Settle};
    use sqlx::Connection as _;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let url = format!("sqlite://{}", path.display());
    {
        let options = std::str::FromStr::from_str(&url).unwrap();
        let options: sqlx::sqlite::SqliteConnectOptions = options;
        let mut c = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        sqlx::raw_sql(include_str!("../migrations/0001_init.sql"))
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::raw_sql(
            "PRAGMA user_version = 1; INSERT INTO relayq_jobs
                (queue, state, payload, priority, run_at, max_attempts, created_at)
                VALUES ('old', 'ready', x'01', 0, 0, 3, 0)",
        )
        .execute(&mut c)
        .await
        .unwrap();
    }
    let backend = SqliteBackend::open(&url).await.unwrap();
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(version, 13);
    // Version 5 adds the progress column, read back by `job`.
    let info = relayq_core::Inspect::job(&backend, "old", relayq_core::JobId(1))
        .await
        .unwrap();
    assert_eq!(info.progress, None);
    let schedules: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'relayq_schedules'",
    )
    .fetch_one(backend.pool())
    .await
    .unwrap();
    assert_eq!(schedules, 1, "version 4 adds the schedules table");
    let holder: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'relayq_jobs_holder'",
    )
    .fetch_one(backend.pool())
    .await
    .unwrap();
    assert_eq!(holder, 1, "version 3 adds the group holder index");
    let job = backend
        .claim(ClaimRequest::new(
            "old",
            "w",
            1,
            std::time::Duration::from_secs(30),
        ))
        .await
        .unwrap()
        .pop()
        .expect("the version-1 job survives the upgrade");
    assert_eq!(job.id(), JobId(1));
    backend
        .settle_one(Settle::complete(job.lease).with_output(Some("kept".into())))
        .await
        .unwrap();
    let log = backend.job("old", JobId(1)).await.unwrap().attempt_log;
    assert_eq!(log[0].output.as_deref(), Some("kept"));
    assert!(
        backend
            .enqueue_one(NewJob::new("old", vec![]))
            .await
            .is_ok()
    );
}
