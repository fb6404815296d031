//! What the standalone server's tests share: the conformance environment, the server's
//! version, and a user it refuses functions.
#![allow(dead_code)] // Each test binary uses its own part of these helpers.

use std::sync::Arc;

use relayq_conformance::Env;
use relayq_core::Backend;
use relayq_redis::RedisBackend;

/// The conformance suite's environment on the server at `url` with key prefix `prefix`:
/// its handle, and a factory of further handles.
pub async fn env(url: String, prefix: &'static str) -> Env {
    let backend = RedisBackend::connect_with_prefix(&url, prefix)
        .await
        .expect("connect to Redis");
    let server = url.clone();
    Env::new(backend, move || {
        let url = url.clone();
        async move {
            let handle: Arc<dyn Backend> =
                Arc::new(RedisBackend::connect_with_prefix(&url, prefix).await?);
            Ok(handle)
        }
    })
    .with_unreachable(move || async move {
        let url = format!(
            "redis://:{}@127.0.0.1:1/0",
            relayq_conformance::UNREACHABLE_PASSWORD
        );
        let handle: Arc<dyn Backend> =
            Arc::new(RedisBackend::connect_with_prefix(&url, prefix).await?);
        Ok(handle)
    })
    .with_proxy(server, move |url| async move {
        let handle: Arc<dyn Backend> =
            Arc::new(RedisBackend::connect_with_prefix(&url, prefix).await?);
        Ok(handle)
    })
}

/// The server's major version (`INFO server`).
pub async fn major_version(url: &str) -> u32 {
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .expect("redis_version in INFO server")
}

/// The URL of `url`'s server as `user`, (re)made here: it may run anything on the keys
/// and channels of `prefix` but functions (`FCALL`, `FUNCTION`) and the admin and
/// dangerous commands, so a user left behind on the server can do no harm outside
/// its prefix. Needs Redis 7 (ACL rules for `FCALL`).
pub async fn user_without_functions(url: &str, user: &str, prefix: &str) -> String {
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = format!("~{prefix}:*");
    let channels = format!("&{prefix}:*");
    redis::cmd("ACL")
        .arg(&["SETUSER", user, "reset", "on", "nopass", &keys, &channels][..])
        .arg(
            &[
                "+@all",
                "-@admin",
                "-@dangerous",
                "-fcall",
                "-fcall_ro",
                "-function",
            ][..],
        )
        .exec_async(&mut c)
        .await
        .unwrap();
    // Any password opens a `nopass` user; without one, the client would not log in.
    url.replacen("redis://", &format!("redis://{user}:unused@"), 1)
}

/// The key prefix of the Redis-specific tests.
pub const PREFIX: &str = "relayq-test";

/// A handle on the server at `url` (given by `server_tests!`, which reports a test
/// whose server is absent as ignored), and a raw connection to it.
pub async fn setup(url: &str) -> (RedisBackend, redis::aio::MultiplexedConnection) {
    let b = RedisBackend::connect_with_prefix(url, PREFIX)
        .await
        .unwrap();
    let raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (b, raw)
}

pub fn jobs(queue: &str, n: usize) -> Vec<relayq_core::NewJob> {
    (0..n)
        .map(|i| relayq_core::NewJob::new(queue, i.to_string().into_bytes()))
        .collect()
}
