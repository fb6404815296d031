//! Backend errors say whether they are transient (SPEC X4): a connection killed under
//! a call gives a transient error, which callers (the worker's settler) may retry.

use std::time::Duration;

use relayq_conformance::{poll_until, queue_name};
use relayq_core::{Admin, ErrorKind};
use relayq_postgres::{Config, PostgresBackend};

mod common;
use common::{SERVER, drop_schema, fresh};

relayq_conformance::server_tests! {
    server: SERVER,
    tests: [a_killed_connection_gives_a_transient_error],
}

/// A call whose connection is terminated by the server (`pg_terminate_backend`, what a
/// failover or an operator does) fails with a transient error.
async fn a_killed_connection_gives_a_transient_error(url: String) {
    let admin = fresh(&url, "errors").await;
    let s = admin.schema().to_owned();
    let b = PostgresBackend::connect_with(
        &url,
        Config::default().with_schema(&s).with_max_connections(1),
    )
    .await
    .unwrap();
    let q = queue_name("errors");
    // The queues table locked elsewhere: the pause waits on it, so it can be killed
    // while it runs.
    let mut holder = admin.pool().begin().await.unwrap();
    let lock = format!("LOCK TABLE \"{s}\".queues IN ACCESS EXCLUSIVE MODE");
    sqlx::raw_sql(sqlx::AssertSqlSafe(lock))
        .execute(&mut *holder)
        .await
        .unwrap();
    let pausing = tokio::spawn({
        let (b, q) = (b.clone(), q.clone());
        async move { b.pause(&q).await }
    });
    let pid: i32 = poll_until(
        "the pause to wait on the lock",
        Duration::from_secs(10),
        || {
            let pool = admin.pool().clone();
            async move {
                Ok(sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%queues%'",
                )
                .fetch_optional(&pool)
                .await?)
            }
        },
    )
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(admin.pool())
        .await
        .unwrap();
    let err = pausing
        .await
        .unwrap()
        .expect_err("the pause's connection was killed");
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    holder.rollback().await.unwrap();
    // A call that can never pass is not transient.
    let err =
        PostgresBackend::connect_with(&url, Config::default().with_schema("relayq_missing_x"))
            .await
            .unwrap()
            .pause(&q)
            .await
            .expect_err("the schema was never made");
    assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
    assert!(!err.is_transient(), "{err}");
    drop_schema(&admin).await;
}
