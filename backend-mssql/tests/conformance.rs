//! The whole conformance suite against SQL Server: `RELAYQ_MSSQL_URL`, or a container
//! (`mcr.microsoft.com/mssql/server:2022-latest`) when Docker answers, or one SKIPPED
//! line. Every case shares one schema (cases isolate themselves by queue name) and
//! migrates it first, so the concurrent `migrate` path runs on every run too.

use std::sync::Arc;

use relayq_conformance::{Env, harness::Server};
use relayq_core::Backend;
use relayq_mssql::{Config, MssqlBackend};

/// Named after the schema version, so a server shared with another version of this
/// crate (an older checkout, a branch with a new migration) never hands either one a
/// schema it refuses.
fn schema() -> String {
    format!("relayq_conformance_v{}", relayq_mssql::SCHEMA_VERSION)
}

async fn open(url: &str) -> relayq_core::Result<MssqlBackend> {
    let config = Config::default()
        .with_schema(schema())
        .with_max_connections(4);
    MssqlBackend::connect_with(url, config).await
}

async fn env() -> Option<Env> {
    let url = relayq_conformance::harness::server_url(Server::Mssql).await?;
    let backend = open(&url).await.expect("connect to SQL Server");
    backend.migrate().await.expect("migrate");
    Some(Env::new(backend, move || {
        let url = url.clone();
        async move {
            let handle: Arc<dyn Backend> = Arc::new(open(&url).await?);
            Ok(handle)
        }
    }))
}

relayq_conformance::suite!(env);
