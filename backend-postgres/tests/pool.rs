//! The pool's connection check (`Config::check_after_idle`): a connection idle that long
//! is checked before an operation uses it, so one the server dropped meanwhile is
//! replaced; a connection used more recently is not checked, which keeps a claim to
//! one round trip.

use std::time::Duration;

use relayq_conformance::{poll_until, queue_name};
use relayq_core::{Enqueue, Error, Inspect, JobState, NewJob};
use relayq_postgres::{Config, PostgresBackend};
use sqlx::Connection;

mod common;
use common::drop_schema;

/// A backend whose connections carry the application name `app`, so the test can find
/// them in `pg_stat_activity`.
async fn backend(url: &str, app: &str, check_after_idle: Duration) -> PostgresBackend {
    let sep = if url.contains('?') { '&' } else { '?' };
    let schema = format!("relayq_t_{app}");
    let config = Config::default()
        .with_schema(schema)
        .with_max_connections(2)
        .with_check_after_idle(check_after_idle);
    let b = PostgresBackend::connect_with(&format!("{url}{sep}application_name={app}"), config)
        .await
        .expect("connect");
    b.migrate().await.expect("migrate");
    b
}

/// Terminates every server process of `b` (application name `app`) and waits until
/// they are gone. First waits for every pooled connection to be back and idle: sqlx
/// pings a connection on its way back, and a connection killed during that ping would
/// be dropped by sqlx itself, never reaching the operation under test.
async fn kill_connections(b: &PostgresBackend, url: &str, app: &str) {
    poll_until(
        "the pool's connections are idle",
        Duration::from_secs(10),
        || {
            let pool = b.pool();
            async move {
                let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
                Ok((pool.size() > 0 && idle == pool.size()).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let mut admin = sqlx::PgConnection::connect(url).await.unwrap();
    let pids: Vec<i32> =
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(app)
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert!(!pids.is_empty(), "the backend has pooled connections");
    for pid in &pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let admin = &tokio::sync::Mutex::new(admin);
    poll_until(
        "the terminated connections are gone",
        Duration::from_secs(10),
        || {
            let pids = pids.clone();
            async move {
                let n: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                        .bind(&pids)
                        .fetch_one(&mut *admin.lock().await)
                        .await?;
                Ok((n == 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

fn app(tag: &str) -> String {
    format!("{tag}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// SPEC X3 (a connection failure loses nothing): with the check on every idle
/// connection, a connection the server dropped fails no operation at all.
async fn an_idle_connection_the_server_dropped_is_replaced_before_use(url: String) {
    let app = app("pool_checked");
    let b = backend(&url, &app, Duration::ZERO).await;
    let q = queue_name("pool");
    b.enqueue(vec![NewJob::new(&q, b"1".to_vec())])
        .await
        .unwrap();

    kill_connections(&b, &url, &app).await;
    b.enqueue(vec![NewJob::new(&q, b"2".to_vec())])
        .await
        .expect("the dead connection is checked, dropped and replaced");
    assert_eq!(b.queue_stats(&q).await.unwrap().count(JobState::Ready), 2);
    drop_schema(&b).await;
}

/// SPEC X1, X3: unchecked, a dropped connection fails the operation that takes it with
/// `Error::Backend`, and that operation stores nothing.
async fn a_recently_used_connection_is_not_checked(url: String) {
    let app = app("pool_unchecked");
    let b = backend(&url, &app, Duration::from_secs(3600)).await;
    let q = queue_name("pool");
    b.enqueue(vec![NewJob::new(&q, b"1".to_vec())])
        .await
        .unwrap();

    kill_connections(&b, &url, &app).await;
    // Unchecked, a dead connection fails the operation that takes it, once: the pool
    // then drops it. Two connections at most, so the third attempt works.
    let mut failed = 0;
    for _ in 0..3 {
        match b.enqueue(vec![NewJob::new(&q, b"2".to_vec())]).await {
            Ok(_) => break,
            Err(Error::Backend { .. }) => failed += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(failed >= 1, "a dead connection was used without a check");
    assert!(failed < 3, "the pool kept handing out dead connections");
    assert_eq!(
        b.queue_stats(&q).await.unwrap().count(JobState::Ready),
        2,
        "a failed enqueue stored nothing"
    );
    drop_schema(&b).await;
}

relayq_conformance::server_tests! {
    server: common::SERVER,
    tests: [
        an_idle_connection_the_server_dropped_is_replaced_before_use,
        a_recently_used_connection_is_not_checked,
    ],
}
