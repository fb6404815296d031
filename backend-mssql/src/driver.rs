//! [`DRIVER`]: this backend as the rest of relayq sees it (`mssql://` URLs).

use std::sync::Arc;

use relayq_core::{
    Backend, Driver, Migrate, Result, TestServer,
    driver::{Image, Ready},
    kit::url_options,
};

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
        image: Some(Image {
            name: "mcr.microsoft.com/mssql/server",
            tag: "2022-latest",
            port: 1433,
            env: &[
                ("ACCEPT_EULA", "Y"),
                ("MSSQL_PID", "Developer"),
                ("MSSQL_SA_PASSWORD", "relayq-Test-1"),
            ],
            ready: &[
                Ready::Stdout("SQL Server is now ready for client connections"),
                Ready::Stdout("Recovery is complete"),
            ],
            url: "mssql://sa:relayq-Test-1@127.0.0.1:{port}/master?trust_cert=true",
        }),
        to_url: None,
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
    match migrate {
        Migrate::Yes => b.migrate().await?,
        Migrate::No => b.check_schema().await?,
    }
    Ok(Arc::new(b))
}
