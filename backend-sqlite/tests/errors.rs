//! Backend errors say whether they are transient (SPEC X4): a database locked by
//! another connection past the busy timeout gives a transient error, which callers
//! (the worker's settler) may retry.
use std::str::FromStr;

use relayq_core::{EnqueueExt, ErrorKind, NewJob};
use relayq_sqlite::SqliteBackend;
use sqlx::{Connection, sqlite::SqliteConnectOptions};

/// Another process holds the write lock (`BEGIN EXCLUSIVE`) for longer than the busy
/// timeout: the enqueue fails with `SQLITE_BUSY`, a transient error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_past_the_busy_timeout_gives_a_transient_error() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("busy.db").display());
    let b = SqliteBackend::open(&url).await.unwrap();
    let mut holder =
        sqlx::SqliteConnection::connect_with(&SqliteConnectOptions::from_str(&url).unwrap())
            .await
            .unwrap();
    sqlx::raw_sql("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let err = b
        .enqueue_one(NewJob::new("busy", b"x".to_vec()))
        .await
        .expect_err("the database is locked");
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    b.enqueue_one(NewJob::new("busy", b"x".to_vec()))
        .await
        .expect("the lock is gone");
}
