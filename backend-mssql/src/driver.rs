//! [`DRIVER`]: this backend as the rest of relayq sees it (`mssql://` URLs).

use std::sync::Arc;

use relayq_core::{Backend, Driver, Migrate, Result, TestServer, kit::url_options};

use crate::{Config, MssqlBackend};

/// SQL Server: `mssql://USER:PASSWORD@HOST:PORT/DB`, with relayq's options
/// `?schema=NAME` and `?max_connections=N`.
pub static DRIVER: Driver = Driver {
    name: "mssql",
    schemes: &["mssql", "sqlserver"],
    feature: "mssql",
    example_url: "mssql://USER:PASSWORD@HOST:PORT/DB",
    open: |url, migrate| Box::pin(open(url, migrate)),
    server: Some(TestServer {
        name: "mssql",
        env_var: "RELAYQ_MSSQL_URL",
    }),
};

async fn open(url: String, migrate: Migrate) -> Result<Arc<dyn Backend>> {
    let (url, o) = url_options::take(&url, &["schema", "max_connections"])?;
    let mut config = Config::default();
    if let Some(schema) = o.schema {
        config = config.with_schema(schema);
    }
    if let Some(n) = o.max_connections {
        config = config.with_max_connections(n);
    }
    let b = MssqlBackend::connect_with(&url, config).await?;
    if migrate == Migrate::Yes {
        b.migrate().await?;
    }
    Ok(Arc::new(b))
}
