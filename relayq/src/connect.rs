//! A URL → the backend it names.

use std::sync::Arc;

use relayq_core::{Backend, Error, Result, memory::MemoryBackend};

#[cfg(any(feature = "postgres", feature = "redis", feature = "mssql"))]
use crate::options;

/// Whether [`connect_with`] creates or updates the schema of a SQL server backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrate {
    /// Run the backend's migrations (idempotent, safe from many processes at once).
    Yes,
    /// Leave the schema alone: for tools that only read, which then fail with a clear
    /// error naming `migrate()` when the schema is missing or older.
    No,
}

/// The URL schemes this build can open, for messages.
#[must_use]
pub fn schemes() -> Vec<&'static str> {
    let mut out = Vec::new();
    if cfg!(feature = "sqlite") {
        out.push("sqlite://");
    }
    if cfg!(feature = "postgres") {
        out.push("postgres://");
    }
    if cfg!(feature = "redis") {
        out.extend(["redis://", "rediss://", "redis-cluster://"]);
    }
    if cfg!(feature = "mssql") {
        out.push("mssql://");
    }
    out.push("memory://");
    out
}

/// Opens the backend `url` names (see the table in the crate docs), with its schema
/// created or brought up to date.
///
/// # Errors
/// [`Error::InvalidInput`] on `url` for a URL without a scheme, an unknown scheme, or
/// one whose backend this build left out (the message names the cargo feature); the
/// backend's own error when it cannot connect ([`Error::is_transient`] for a refused or
/// lost connection).
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    connect_with(url, Migrate::Yes).await
}

/// [`connect`], saying whether to migrate.
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(url: &str, migrate: Migrate) -> Result<Arc<dyn Backend>> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::invalid(
            "url",
            format!("no scheme: write one of {}", schemes().join(", ")),
        ));
    };
    let migrate = migrate == Migrate::Yes;
    match scheme {
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(relayq_sqlite::SqliteBackend::open(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let (url, o) = options::take(url, &["schema", "max_connections"])?;
            let mut config = relayq_postgres::Config::default();
            if let Some(schema) = o.schema {
                config = config.with_schema(schema);
            }
            if let Some(n) = o.max_connections {
                config = config.with_max_connections(n);
            }
            let b = relayq_postgres::PostgresBackend::connect_with(&url, config).await?;
            if migrate {
                b.migrate().await?;
            } else {
                b.check_schema().await?;
            }
            Ok(Arc::new(b))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let (url, o) = options::take(url, &["prefix"])?;
            let prefix = o.prefix.as_deref().unwrap_or(relayq_redis::DEFAULT_PREFIX);
            Ok(Arc::new(
                relayq_redis::RedisBackend::connect_with_prefix(&url, prefix).await?,
            ))
        }
        #[cfg(feature = "redis")]
        "redis-cluster" => {
            let (url, o) = options::take(url, &["prefix"])?;
            let nodes = cluster_nodes(&url)?;
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let prefix = o.prefix.as_deref().unwrap_or(relayq_redis::DEFAULT_PREFIX);
            Ok(Arc::new(
                relayq_redis::RedisBackend::cluster(&nodes, prefix).await?,
            ))
        }
        #[cfg(feature = "mssql")]
        "mssql" | "sqlserver" => {
            let (url, o) = options::take(url, &["schema", "max_connections"])?;
            let mut config = relayq_mssql::Config::default();
            if let Some(schema) = o.schema {
                config = config.with_schema(schema);
            }
            if let Some(n) = o.max_connections {
                config = config.with_max_connections(n);
            }
            let b = relayq_mssql::MssqlBackend::connect_with(&url, config).await?;
            if migrate {
                b.migrate().await?;
            }
            Ok(Arc::new(b))
        }
        other => Err(unknown(other)),
    }
}

/// `redis-cluster://a:7000,b:7001/?query` → `redis://a:7000/?query`, `redis://b:7001/?query`:
/// the nodes to start from, each with the URL's user, password and options.
#[cfg(feature = "redis")]
fn cluster_nodes(url: &str) -> Result<Vec<String>> {
    let rest = url.strip_prefix("redis-cluster://").unwrap_or(url);
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let (hosts, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Err(Error::invalid(
            "url",
            "redis-cluster:// needs at least one node: redis-cluster://host:7000,host:7001",
        ));
    }
    Ok(nodes)
}

fn unknown(scheme: &str) -> Error {
    let feature = match scheme {
        "sqlite" => Some("sqlite"),
        "postgres" | "postgresql" => Some("postgres"),
        "redis" | "rediss" | "redis-cluster" => Some("redis"),
        "mssql" | "sqlserver" => Some("mssql"),
        _ => None,
    };
    let reason = match feature {
        Some(f) => {
            format!("{scheme}:// is not built into this program: enable relayq's `{f}` feature")
        }
        None => format!(
            "unknown scheme {scheme}://: this program has {}",
            schemes().join(", ")
        ),
    };
    Error::invalid("url", reason)
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_each_node_with_the_shared_parts() {
        let nodes = cluster_nodes("redis-cluster://u:p@a:7000,b:7001/?x=1").unwrap();
        assert_eq!(
            nodes,
            ["redis://u:p@a:7000/?x=1", "redis://u:p@b:7001/?x=1"]
        );
        assert!(cluster_nodes("redis-cluster://").is_err());
    }
}
