//! The whole conformance suite, and the model check, against SQLite: one database file
//! per test process, shared by every case (cases isolate themselves by queue name),
//! each extra handle opening its own pool on the same file.

use std::sync::Arc;

use relayq_conformance::{Capability, Env, Subject};
use relayq_core::Backend;
use relayq_sqlite::SqliteBackend;

struct Sqlite {
    url: &'static str,
}

impl Subject for Sqlite {
    const NAME: &'static str = "sqlite";
    // Handles on one file in one process share an event bus.
    const CAPABILITIES: &'static [Capability] = &[Capability::Notifications];

    async fn open(_: Option<String>) -> anyhow::Result<Self> {
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("conformance-{}.db", uuid::Uuid::new_v4().simple()));
        let url = format!("sqlite://{}", file.display()).leak();
        Ok(Self { url })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let url = self.url;
        let backend = SqliteBackend::open(url).await?;
        Ok(Env::new(backend, move || async move {
            let handle: Arc<dyn Backend> = Arc::new(SqliteBackend::open(url).await?);
            Ok(handle)
        }))
    }
}

relayq_conformance::suite!(Sqlite);
