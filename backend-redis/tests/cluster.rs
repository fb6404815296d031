//! The whole conformance suite against Redis Cluster (`RELAYQ_REDIS_CLUSTER_URLS`, a
//! comma-separated list of node URLs, or one SKIPPED line). Each case's random queue
//! names land in different slots, so the cases spread over the masters.

use std::sync::Arc;

use relayq_conformance::{Env, harness::Server};
use relayq_core::Backend;
use relayq_redis::RedisBackend;

const PREFIX: &str = "relayq-cluster";

async fn open(urls: &str) -> relayq_core::Result<RedisBackend> {
    let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
    RedisBackend::cluster(&urls, PREFIX).await
}

async fn env() -> Option<Env> {
    let urls = relayq_conformance::harness::server_url(Server::RedisCluster).await?;
    let backend = open(&urls).await.expect("connect to Redis Cluster");
    Some(Env::new(backend, move || {
        let urls = urls.clone();
        async move {
            let handle: Arc<dyn Backend> = Arc::new(open(&urls).await?);
            Ok(handle)
        }
    }))
}

relayq_conformance::suite!(env);
