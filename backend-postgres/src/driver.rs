//! [`DRIVER`]: this backend as the rest of relayq sees it (`postgres://` URLs).

use std::sync::Arc;

use relayq_core::{
    Backend, Driver, Migrate, Result, TestServer,
    driver::{Image, Ready},
    kit::url_options,
};

use crate::{Config, PostgresBackend};

/// PostgreSQL: `postgres://USER:PASSWORD@HOST:PORT/DB`, with relayq's options
/// `?schema=NAME` and `?max_connections=N`.
pub static DRIVER: Driver = Driver {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    feature: "postgres",
    example_url: "postgres://USER:PASSWORD@HOST:PORT/DB",
    open: |url, migrate| Box::pin(open(url, migrate)),
    server: Some(TestServer {
        name: "postgres",
        env_var: "RELAYQ_POSTGRES_URL",
        image: Some(Image {
            name: "postgres",
            tag: "16",
            port: 5432,
            env: &[("POSTGRES_PASSWORD", "postgres")],
            // The image's first server (during initdb) says it on one stream, the real
            // one on both.
            ready: &[
                Ready::Stderr("database system is ready to accept connections"),
                Ready::Stdout("database system is ready to accept connections"),
            ],
            url: "postgres://postgres:postgres@127.0.0.1:{port}/postgres",
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
    let b = PostgresBackend::connect_with(&url, config).await?;
    match migrate {
        Migrate::Yes => b.migrate().await?,
        Migrate::No => b.check_schema().await?,
    }
    Ok(Arc::new(b))
}
