//! Redis Functions: a server that lost relayq's library gets it again from the next
//! call, and a server that refuses functions runs the same operations as scripts.
//!
//! A test binary of its own: `cargo test` runs one binary at a time, so while these
//! cases delete the library no other case of this crate loads it again meanwhile.

mod support;

use std::time::Duration;

use relayq_conformance::{harness::Server, queue_name};
use relayq_core::{Claim, ClaimRequest, CompleteExt, Enqueue, Inspect, JobState, NewJob};
use relayq_redis::RedisBackend;

const PREFIX: &str = "relayq-test-functions";
const LEASE: Duration = Duration::from_secs(30);

fn main() {
    use relayq_conformance::runner::{run, server_test};
    run(vec![
        server_test(
            Server::of(&relayq_redis::DRIVER),
            "a_lost_library_is_loaded_again",
            a_lost_library_is_loaded_again,
        ),
        server_test(
            Server::of(&relayq_redis::DRIVER),
            "without_functions_operations_run_as_scripts",
            without_functions_operations_run_as_scripts,
        ),
        server_test(
            Server::of(&relayq_redis::CLUSTER_DRIVER),
            "a_master_that_lacks_the_library_gets_it",
            a_master_that_lacks_the_library_gets_it,
        ),
    ])
}

/// Ends the test as ignored unless the server at `urls` (a cluster's node URLs,
/// comma-separated) runs Redis 7 or later.
async fn need_redis7(urls: &str) {
    let first = urls.split(',').next().unwrap_or_default().trim();
    if support::major_version(first).await < 7 {
        relayq_conformance::runner::skip("Redis before 7.0 has no functions");
    }
}

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// How many libraries named as this version's the server holds: 0 or 1.
async fn libraries(c: &mut redis::aio::MultiplexedConnection) -> usize {
    let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(relayq_redis::function_library())
        .query_async(c)
        .await
        .unwrap();
    listed.len()
}

async fn lose_library(c: &mut redis::aio::MultiplexedConnection) {
    // Deleted already, or never loaded: either way it is gone.
    let _: redis::RedisResult<()> = redis::cmd("FUNCTION")
        .arg("DELETE")
        .arg(relayq_redis::function_library())
        .query_async(c)
        .await;
    assert_eq!(libraries(c).await, 0);
}

/// Enqueue, claim, complete and read on `q`, with `between` run before each call.
async fn same_after_each_call<F: std::future::Future<Output = ()>>(
    b: &RedisBackend,
    q: &str,
    mut between: impl FnMut() -> F,
) {
    between().await;
    let ids = b
        .enqueue(vec![
            NewJob::new(q, b"1".to_vec()),
            NewJob::new(q, b"2".to_vec()),
        ])
        .await
        .unwrap();
    between().await;
    let got = b.claim(ClaimRequest::new(q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(got.len(), 2);
    between().await;
    b.complete(&got[0].lease).await.unwrap();
    between().await;
    let info = b.job(q, ids[0].id).await.unwrap();
    assert_eq!(info.state, JobState::Succeeded);
    let stats = b.queue_stats(q).await.unwrap();
    assert_eq!(stats.count(JobState::Running), 1);
}

/// Deleting the library before each call (a restart without persistence, `FUNCTION
/// FLUSH`) changes nothing visible: each call loads it again. Many calls that find it
/// missing at once load it once.
async fn a_lost_library_is_loaded_again(url: String) {
    need_redis7(&url).await;
    let b = RedisBackend::connect_with_prefix(&url, PREFIX)
        .await
        .unwrap();
    let raw = connection(&url).await;
    let q = queue_name("lost");
    same_after_each_call(&b, &q, || {
        let mut c = raw.clone();
        async move { lose_library(&mut c).await }
    })
    .await;
    assert_eq!(libraries(&mut raw.clone()).await, 1);

    // Calls that find it missing at once load it once.
    let mut raw = raw;
    let before = loads(&mut raw).await;
    lose_library(&mut raw).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (b, q) = (b.clone(), q.clone());
        calls.spawn(async move { b.enqueue(vec![NewJob::new(&q, vec![i])]).await });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap().unwrap();
    }
    assert_eq!(loads(&mut raw).await - before, 1);
}

/// `FUNCTION LOAD`s the server has run (`INFO commandstats`).
async fn loads(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_function|load:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A server that refuses functions (Redis 6, or here an ACL without `FCALL` and
/// `FUNCTION`) runs every operation as a script, and `SCRIPT FLUSH` between calls
/// changes nothing visible: each script is loaded again on `NOSCRIPT`.
async fn without_functions_operations_run_as_scripts(url: String) {
    need_redis7(&url).await;
    let limited = support::user_without_functions(&url, "relayq-test-no-functions", PREFIX).await;
    let b = RedisBackend::connect_with_prefix(&limited, PREFIX)
        .await
        .unwrap();
    let raw = connection(&url).await;
    let q = queue_name("scripts");
    same_after_each_call(&b, &q, || {
        let mut c = raw.clone();
        async move {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .exec_async(&mut c)
                .await
                .unwrap();
        }
    })
    .await;
}

/// A cluster master that lacks the library (a new master, one restarted without
/// persistence) gets it from its first call: each master in turn loses it, then a
/// queue it serves runs every operation.
async fn a_master_that_lacks_the_library_gets_it(urls: String) {
    need_redis7(&urls).await;
    let seeds: Vec<&str> = urls.split(',').map(str::trim).collect();
    let b = RedisBackend::cluster(&seeds, PREFIX).await.unwrap();
    let mut masters = Vec::new();
    for url in &seeds {
        let mut c = connection(url).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.unwrap();
        if role.first() == Some(&redis::Value::BulkString(b"master".to_vec())) {
            masters.push(c);
        }
    }
    assert!(masters.len() > 1, "{urls}");
    for c in &mut masters {
        // A queue this master serves: the others answer a key of its slots with MOVED.
        let mut q = None;
        for _ in 0..10_000 {
            let name = queue_name("master");
            let served: redis::RedisResult<i64> = redis::cmd("EXISTS")
                .arg(b.queue_key(&name))
                .query_async(c)
                .await;
            if served.is_ok() {
                q = Some(name);
                break;
            }
        }
        let q = q.expect("a queue on every master");
        let conn = c.clone();
        same_after_each_call(&b, &q, || {
            let mut c = conn.clone();
            async move { lose_library(&mut c).await }
        })
        .await;
        assert_eq!(libraries(c).await, 1, "{q}");
    }
}
