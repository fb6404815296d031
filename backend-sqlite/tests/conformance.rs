//! The whole conformance suite against SQLite: one database file per test process,
//! shared by every case (cases isolate themselves by queue name), each extra handle
//! opening its own pool on the same file.

use std::sync::Arc;

use relayq_conformance::Env;
use relayq_core::Backend;
use relayq_sqlite::SqliteBackend;
use tokio::sync::OnceCell;

async fn url() -> &'static str {
    static URL: OnceCell<String> = OnceCell::const_new();
    URL.get_or_init(|| async {
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("conformance-{}.db", uuid::Uuid::new_v4().simple()));
        format!("sqlite://{}", file.display())
    })
    .await
}

async fn env() -> Option<Env> {
    let url = url().await;
    let backend = SqliteBackend::open(url)
        .await
        .expect("open SQLite database");
    Some(Env::new(backend, move || async move {
        let handle: Arc<dyn Backend> = Arc::new(SqliteBackend::open(url).await?);
        Ok(handle)
    }))
}

relayq_conformance::suite!(env);
