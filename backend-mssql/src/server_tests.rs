//! Checks of the review against SQL Server's documentation that need a server: `RELAYQ_MSSQL_URL`;
//! without it they are compiled as ignored (see `build.rs`; `RELAYQ_REQUIRE=mssql` makes
//! a missing server a failure). Unit tests rather than `tests/`, because they look at what
//! the public API hides: the tables' settings, which connection the pool hands out.
//! Each test works in a schema of its own.

use std::time::Duration;

use relayq_conformance::harness::{Server, server_url};
use relayq_core::{
    Claim, ClaimRequest, Complete, CompleteExt, EnqueueExt, NewJob, OnFailure, OrderBarrier,
};

use crate::{Config, MssqlBackend, rows, sql};

const LEASE: Duration = Duration::from_secs(30);

fn config(tag: &str) -> Config {
    let schema = format!(
        "relayq_u_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    Config::default()
        .with_schema(schema)
        .with_max_connections(1)
}

/// A migrated backend with one pooled connection.
async fn backend(tag: &str) -> (String, MssqlBackend) {
    let url = server_url(Server::of(&crate::DRIVER))
        .await
        .expect("RELAYQ_MSSQL_URL");
    let b = MssqlBackend::connect_with(&url, config(tag)).await.unwrap();
    b.migrate().await.unwrap();
    (url, b)
}

/// Runs `template` (filled for `b`'s schema) as a plain batch on a pooled connection.
async fn batch(b: &MssqlBackend, template: &str) -> Result<(), tiberius::error::Error> {
    let mut conn = b.inner.pool.get().await.unwrap();
    conn.busy = true;
    let sql = b.inner.schema.fill(template);
    conn.client.simple_query(sql).await?.into_results().await?;
    conn.done();
    Ok(())
}

const ESCALATION: &str = "
SELECT name, lock_escalation_desc FROM sys.tables
WHERE schema_id = SCHEMA_ID(N'{n}') AND name <> N'migrations' ORDER BY name;";

/// Item 1: after `migrate`, no queue table escalates its locks, and running
/// migration 2 again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(relayq_no_mssql, ignore = "no mssql server: RELAYQ_MSSQL_URL unset")]
async fn queue_tables_never_escalate_to_a_table_lock() {
    let (_, b) = backend("esc").await;
    let sets = b.run(ESCALATION, &[]).await.unwrap();
    let got: Vec<(String, String)> = rows::set(&sets, 0)
        .unwrap()
        .iter()
        .map(|r| {
            let name: &str = rows::req(r, 0).unwrap();
            let mode: &str = rows::req(r, 1).unwrap();
            (name.to_owned(), mode.to_owned())
        })
        .collect();
    let want: Vec<(String, String)> = ["attempts", "batches", "jobs", "queues"]
        .iter()
        .map(|t| ((*t).to_owned(), "DISABLE".to_owned()))
        .collect();
    assert_eq!(got, want);
    batch(&b, sql::MIGRATIONS[1]).await.unwrap();
    b.migrate().await.unwrap();
}

/// Item 4: a migrator that finds the migration lock taken is told so by the server
/// (error 51001) before its command timeout would cut the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(relayq_no_mssql, ignore = "no mssql server: RELAYQ_MSSQL_URL unset")]
async fn a_blocked_migration_times_out_on_the_server_first() {
    let (url, holder) = backend("miglock").await;
    let mut held = holder.inner.pool.get().await.unwrap();
    held.busy = true; // discarded on drop: closing it rolls back and frees the lock
    let take = holder.inner.schema.fill(
        "BEGIN TRANSACTION; EXEC sp_getapplock @Resource = N'relayq migrate {n}', \
         @LockMode = 'Exclusive', @LockOwner = 'Transaction';",
    );
    held.client
        .simple_query(take)
        .await
        .unwrap()
        .into_results()
        .await
        .unwrap();
    let waiter = MssqlBackend::connect_with(
        &url,
        Config::default()
            .with_schema(holder.schema())
            .with_command_timeout(Duration::from_secs(4)),
    )
    .await
    .unwrap();
    let err = waiter.migrate().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("timed out waiting for the migration lock"),
        "{err}"
    );
    drop(held);
}

/// The session's id and login time: a new connection has another pair.
const SESSION: &str =
    "SELECT session_id, login_time FROM sys.dm_exec_sessions WHERE session_id = @@SPID;";

async fn session(b: &MssqlBackend) -> (i16, chrono::NaiveDateTime) {
    let sets = b.run(SESSION, &[]).await.unwrap();
    let row = &rows::set(&sets, 0).unwrap()[0];
    (rows::req(row, 0).unwrap(), rows::req(row, 1).unwrap())
}

/// Item 5: a server error that rolled its transaction back keeps the connection; one
/// that left a transaction open loses it (closing it is what rolls that back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(relayq_no_mssql, ignore = "no mssql server: RELAYQ_MSSQL_URL unset")]
async fn server_errors_keep_the_connection_unless_a_transaction_is_open() {
    let (_, b) = backend("keep").await;
    let first = session(&b).await;
    // THROW with XACT_ABORT on rolls the transaction back.
    b.run(
        "BEGIN TRANSACTION; THROW 51999, N'relayq test: rolled back', 1;",
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(session(&b).await, first, "kept after a rolled-back error");
    // RAISERROR at severity 16 aborts neither the batch nor, even with XACT_ABORT on,
    // the transaction; sent as a plain batch (not through sp_executesql, which would
    // add its own error 266), the transaction is left open.
    let mut conn = b.inner.pool.get().await.unwrap();
    conn.busy = true;
    let left_open = "BEGIN TRANSACTION; RAISERROR(N'relayq test: left open', 16, 1);";
    let err = match conn.client.simple_query(left_open).await {
        Ok(stream) => stream.into_results().await.map(drop).unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(err.code(), Some(50000), "{err}");
    conn.recover(&err).await;
    assert!(
        conn.busy,
        "a connection with a transaction open is not kept"
    );
    drop(conn);
    assert_ne!(
        session(&b).await,
        first,
        "discarded with a transaction open"
    );
}

/// Item 6: with enabled triggers on `jobs` and `batches`, every operation that
/// returns rows from an `UPDATE` or `INSERT` still works (an `OUTPUT` without `INTO`
/// fails with error 334 there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(relayq_no_mssql, ignore = "no mssql server: RELAYQ_MSSQL_URL unset")]
async fn operations_work_with_triggers_on_the_queue_tables() {
    let (_, b) = backend("trg").await;
    for table in ["jobs", "batches"] {
        let trigger = format!(
            "CREATE TRIGGER {{s}}.{table}_audit ON {{s}}.{table} \
             AFTER INSERT, UPDATE, DELETE AS SET NOCOUNT ON;"
        );
        batch(&b, &trigger).await.unwrap();
    }
    let q = relayq_conformance::queue_name("trg");
    let batch_ = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    b.enqueue_one(NewJob::new(&q, b"x".to_vec()).in_batch(batch_.id, 0))
        .await
        .unwrap();
    b.seal(&batch_).await.unwrap();
    let job = b
        .claim(ClaimRequest::new(&q, "w", 1, LEASE))
        .await
        .unwrap()
        .pop()
        .expect("a job");
    b.heartbeat(&job.lease, LEASE).await.unwrap();
    b.complete(&job.lease).await.unwrap();
}
