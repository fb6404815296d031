//! The whole conformance suite, and the model check, against standalone Redis as a user
//! that may not run functions: every operation then runs as a script (`EVALSHA`), the
//! path taken on Redis 6 and where an ACL denies `FCALL` or `FUNCTION`.

mod support;

use relayq_conformance::{Capability, Env, Skip, Subject, harness::Server};

const PREFIX: &str = "relayq-conformance-scripts";

/// The server's URL as the user without functions.
struct RedisScripts {
    url: String,
}

impl Subject for RedisScripts {
    const NAME: &'static str = "redis-scripts";
    const SERVER: Option<Server> = Some(Server::of(&relayq_redis::DRIVER));
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::ConnectionCut,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    async fn open(url: Option<String>) -> anyhow::Result<Self> {
        let url = url.expect("SERVER is set");
        if support::major_version(&url).await < 7 {
            return Err(Skip(
                "Redis before 7.0 has no functions; tests/conformance.rs runs every \
                 operation as a script there"
                    .into(),
            )
            .into());
        }
        let url = support::user_without_functions(&url, PREFIX, PREFIX).await;
        Ok(Self { url })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        Ok(support::env(self.url.clone(), PREFIX).await)
    }
}

relayq_conformance::suite!(RedisScripts);
