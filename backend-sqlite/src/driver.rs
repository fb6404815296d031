//! [`DRIVER`]: this backend as the rest of relayq sees it (`sqlite://` URLs).

use std::sync::Arc;

use relayq_core::{Backend, Driver, Migrate, Result};

use crate::SqliteBackend;

/// SQLite, embedded: `sqlite://PATH` (created when missing), `sqlite::memory:`. Its
/// schema is always brought up to date on open, whatever `Migrate` says: the file is
/// this process's own.
pub static DRIVER: Driver = Driver {
    name: "sqlite",
    schemes: &["sqlite"],
    feature: "sqlite",
    example_url: "sqlite://PATH",
    open: |url, migrate| Box::pin(open(url, migrate)),
    server: None,
};

async fn open(url: String, _migrate: Migrate) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(SqliteBackend::open(&url).await?))
}
