//! The whole conformance suite against standalone Redis as a user that may not run
//! functions: every operation then runs as a script (`EVALSHA`), the path taken on
//! Redis 6 and where an ACL denies `FCALL` or `FUNCTION`.

mod support;

use relayq_conformance::{Env, harness::Server};

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
    Some(support::env(url, PREFIX).await)
}

relayq_conformance::suite!(env);
