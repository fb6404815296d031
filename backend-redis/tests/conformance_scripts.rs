//! The whole conformance suite against standalone Redis as a user that may not run
//! functions: every operation then runs as a script (`EVALSHA`), the path taken on
//! Redis 6 and where an ACL denies `FCALL` or `FUNCTION`.

mod support;

use std::sync::Arc;

use relayq_conformance::{Env, harness::Server};
use relayq_core::Backend;
use relayq_redis::RedisBackend;

const PREFIX: &str = "relayq-conformance-scripts";

async fn env() -> Option<Env> {
    let url = relayq_conformance::harness::server_url(Server::Redis).await?;
    if support::major_version(&url).await < 7 {
        support::skip(
            "Redis before 7.0 has no functions; tests/conformance.rs runs every operation \
             as a script there",
        );
        return None;
    }
    let url = support::user_without_functions(&url, "relayq-conformance-scripts", PREFIX).await;
    let backend = RedisBackend::connect_with_prefix(&url, PREFIX)
        .await
        .expect("connect to Redis");
    Some(Env::new(backend, move || {
        let url = url.clone();
        async move {
            let handle: Arc<dyn Backend> =
                Arc::new(RedisBackend::connect_with_prefix(&url, PREFIX).await?);
            Ok(handle)
        }
    }))
}

relayq_conformance::suite!(env);
