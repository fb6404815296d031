//! SQL Server-specific behaviour, against a real server (`RELAYQ_MSSQL_URL`, or a
//! container; else reported as ignored). Each test works in a schema of its own.

use std::time::Duration;

use relayq_conformance::{harness::Server, queue_name};
use relayq_core::{Claim, ClaimRequest, Enqueue, EnqueueExt, Error, Inspect, NewJob};
use relayq_mssql::{Config, MAX_CLAIM, MssqlBackend};

const LEASE: Duration = Duration::from_secs(30);

fn config(tag: &str) -> Config {
    let schema = format!(
        "relayq_t_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    Config::default().with_schema(schema)
}

/// Migrations run once however many processes start together: each waits for the
/// schema's application lock, then finds the work done.
async fn concurrent_migrations_apply_once(url: String) {
    let config = config("mig");
    let mut handles = Vec::new();
    for _ in 0..4 {
        let (url, config) = (url.clone(), config.clone());
        handles.push(tokio::spawn(async move {
            let b = MssqlBackend::connect_with(&url, config).await?;
            b.migrate().await?;
            b.migrate().await?;
            Ok::<_, Error>(b)
        }));
    }
    let mut last = None;
    for h in handles {
        last = Some(h.await.expect("task").expect("migrate"));
    }
    let b = last.expect("a handle");
    let q = queue_name("mig");
    b.enqueue_one(NewJob::new(&q, b"x".to_vec())).await.unwrap();
    assert_eq!(
        b.queue_stats(&q)
            .await
            .unwrap()
            .counts
            .values()
            .sum::<u64>(),
        1
    );
}

/// SQL Server's `=` ignores trailing spaces; relayq's keys must not: `k` and `k ` are
/// two dedupe keys, and two jobs.
async fn keys_differing_in_trailing_spaces_stay_distinct(url: String) {
    let b = MssqlBackend::connect_with(&url, config("keys"))
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let q = queue_name("keys");
    let jobs = ["k", "k ", "k"]
        .iter()
        .map(|k| NewJob::new(&q, b"x".to_vec()).dedupe_key(*k))
        .collect();
    let out = b.enqueue(jobs).await.unwrap();
    assert!(!out[0].deduplicated && !out[1].deduplicated && out[2].deduplicated);
    assert_ne!(out[0].id, out[1].id);
    assert_eq!(out[2].id, out[0].id);
    let info = b.job(&q, out[1].id).await.unwrap();
    assert_eq!(info.dedupe_key.as_deref(), Some("k "));
}

/// A claim takes at most `MAX_CLAIM` rows whatever it asks, so no statement nears
/// the lock-escalation threshold.
async fn claims_are_capped_below_lock_escalation(url: String) {
    let b = MssqlBackend::connect_with(&url, config("cap"))
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let q = queue_name("cap");
    let jobs: Vec<NewJob> = (0..MAX_CLAIM + 10)
        .map(|i| NewJob::new(&q, i.to_string().into_bytes()))
        .collect();
    b.enqueue(jobs).await.unwrap();
    let got = b
        .claim(ClaimRequest::new(&q, "w", 1000, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), MAX_CLAIM as usize);
}

/// Bad settings are typed errors naming the field, found before any connection.
async fn a_bad_url_is_invalid_input_before_any_connection() {
    let err = MssqlBackend::connect("postgres://x@y/z").await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { field: "url", .. }),
        "{err}"
    );
    let err = MssqlBackend::connect_with(
        "mssql://sa:x@127.0.0.1:1/db",
        Config::default().with_schema("Bad"),
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

relayq_conformance::server_tests! {
    server: Server::of(&relayq_mssql::DRIVER),
    tests: [
        concurrent_migrations_apply_once,
        keys_differing_in_trailing_spaces_stay_distinct,
        claims_are_capped_below_lock_escalation,
    ],
    local: [
        a_bad_url_is_invalid_input_before_any_connection,
    ],
}
