//! Helpers shared by the PostgreSQL-specific test files.
#![allow(dead_code, reason = "each test file uses some of them")]

use std::time::Duration;

use relayq_conformance::harness::Server;
use relayq_core::NewJob;
use relayq_postgres::{Config, PostgresBackend};

pub const LEASE: Duration = Duration::from_secs(30);

/// The server of these tests: `RELAYQ_POSTGRES_URL`, or a container.
pub const SERVER: Server = Server::of(&relayq_postgres::DRIVER);

/// A backend on a new schema, migrated; `drop_schema` removes it.
pub async fn fresh(url: &str, tag: &str) -> PostgresBackend {
    let schema = format!(
        "relayq_t_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let config = Config::default()
        .with_schema(schema)
        .with_max_connections(12);
    let b = PostgresBackend::connect_with(url, config)
        .await
        .expect("connect");
    b.migrate().await.expect("migrate");
    b
}

pub async fn drop_schema(b: &PostgresBackend) {
    run_sql(
        b,
        format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", b.schema()),
    )
    .await;
}

pub fn jobs(queue: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new(queue, i.to_string().into_bytes()))
        .collect()
}

pub async fn run_sql(b: &PostgresBackend, sql: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(b.pool())
        .await
        .unwrap();
}
