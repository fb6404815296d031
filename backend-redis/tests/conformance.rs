//! The whole conformance suite against standalone Redis (`RELAYQ_REDIS_URL`, or a
//! container, or one SKIPPED line). Cases isolate themselves by queue name.

mod support;

use relayq_conformance::{Env, harness::Server};

const PREFIX: &str = "relayq-conformance";

async fn env() -> Option<Env> {
    let url = relayq_conformance::harness::server_url(Server::Redis).await?;
    Some(support::env(url, PREFIX).await)
}

relayq_conformance::suite!(env);
