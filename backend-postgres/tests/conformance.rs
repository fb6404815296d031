//! The whole conformance suite, and the model check, against PostgreSQL
//! (`RELAYQ_POSTGRES_URL`, or a container when Docker answers; else reported as
//! ignored). Every case shares one schema (cases isolate themselves by queue name) and
//! migrates it first, so the concurrent `migrate` path runs on every test run too.

use std::sync::Arc;

use relayq_conformance::{Capability, Env, Subject, harness::Server};
use relayq_core::Backend;
use relayq_postgres::{Config, PostgresBackend};

/// Named after the schema version, so a server shared with another version of this
/// crate (an older checkout, a branch with a new migration) never hands either one a
/// schema it refuses.
fn schema() -> String {
    format!("relayq_conformance_v{}", relayq_postgres::SCHEMA_VERSION)
}

async fn open(url: &str) -> relayq_core::Result<PostgresBackend> {
    let config = Config::default()
        .with_schema(schema())
        .with_max_connections(4);
    PostgresBackend::connect_with(url, config).await
}

struct Postgres {
    url: String,
}

impl Subject for Postgres {
    const NAME: &'static str = "postgres";
    const SERVER: Option<Server> = Some(Server::Postgres);
    const CAPABILITIES: &'static [Capability] =
        &[Capability::Notifications, Capability::Unreachable];

    async fn open(url: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            url: url.expect("SERVER is set"),
        })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let url = self.url.clone();
        let backend = open(&url).await?;
        backend.migrate().await?;
        Ok(Env::new(backend, move || {
            let url = url.clone();
            async move {
                let handle: Arc<dyn Backend> = Arc::new(open(&url).await?);
                Ok(handle)
            }
        })
        .with_unreachable(|| async {
            let url = format!(
                "postgres://relayq:{}@127.0.0.1:1/relayq",
                relayq_conformance::UNREACHABLE_PASSWORD
            );
            let handle: Arc<dyn Backend> = Arc::new(open(&url).await?);
            Ok(handle)
        }))
    }
}

relayq_conformance::suite!(Postgres);
