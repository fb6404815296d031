//! The whole conformance suite against standalone Redis (`RELAYQ_REDIS_URL`, or a
//! container, or one SKIPPED line). Cases isolate themselves by queue name.

use std::sync::Arc;

use relayq_conformance::{Env, harness::Server};
use relayq_core::Backend;
use relayq_redis::RedisBackend;

const PREFIX: &str = "relayq-conformance";

async fn env() -> Option<Env> {
    let url = relayq_conformance::harness::server_url(Server::Redis).await?;
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
