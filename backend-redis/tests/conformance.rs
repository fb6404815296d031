//! The whole conformance suite, and the model check, against standalone Redis
//! (`RELAYQ_REDIS_URL`, or a container; else reported as ignored). Cases isolate
//! themselves by queue name.

mod support;

use relayq_conformance::{Capability, Env, Subject, harness::Server};

struct Redis {
    url: String,
}

impl Subject for Redis {
    const NAME: &'static str = "redis";
    const SERVER: Option<Server> = Some(Server::Redis);
    const CAPABILITIES: &'static [Capability] =
        &[Capability::Notifications, Capability::Unreachable];

    async fn open(url: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            url: url.expect("SERVER is set"),
        })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        Ok(support::env(self.url.clone(), "relayq-conformance").await)
    }
}

relayq_conformance::suite!(Redis);
