//! [`DRIVER`]: this backend as the rest of relayq sees it (`mysql://`, `mariadb://`).

use std::sync::Arc;

use relayq_core::{
    Backend, Driver, Migrate, Result, TestServer,
    driver::{Image, Ready},
    kit::url_options,
};

use crate::{Config, MysqlBackend};

/// MariaDB or MySQL: `mysql://USER:PASSWORD@HOST:PORT/DB` (or `mariadb://`), with
/// relayq's options `?schema=NAME` (the database its tables go in, made when
/// missing) and `?max_connections=N`.
pub static DRIVER: Driver = Driver {
    name: "mysql",
    schemes: &["mysql", "mariadb"],
    feature: "mysql",
    example_url: "mysql://USER:PASSWORD@HOST:PORT/DB",
    open: |url, migrate| Box::pin(open(url, migrate)),
    server: Some(TestServer {
        name: "mysql",
        env_var: "RELAYQ_MYSQL_URL",
        image: Some(Image {
            name: "mariadb",
            tag: "10.11",
            port: 3306,
            env: &[
                ("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "1"),
                ("MARIADB_DATABASE", "test"),
            ],
            ready: &[Ready::Stderr("ready for connections")],
            url: "mysql://root@127.0.0.1:{port}/test",
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
    let b = MysqlBackend::connect_with(&url, config).await?;
    match migrate {
        Migrate::Yes => b.migrate().await?,
        Migrate::No => b.check_schema().await?,
    }
    Ok(Arc::new(b))
}
