//! The backends to measure: always memory and SQLite; servers where their URLs are set.

use std::sync::Arc;

use relayq_core::{Backend, memory::MemoryBackend};

pub enum Target {
    Memory,
    Sqlite(tempfile::TempDir),
    Postgres(String),
    Redis(String),
    RedisCluster(Vec<String>),
}

pub async fn available() -> anyhow::Result<Vec<Target>> {
    let mut out = vec![Target::Memory, Target::Sqlite(tempfile::tempdir()?)];
    if let Ok(url) = std::env::var("RELAYQ_POSTGRES_URL") {
        out.push(Target::Postgres(url));
    }
    if let Ok(url) = std::env::var("RELAYQ_REDIS_URL") {
        out.push(Target::Redis(url));
    }
    if let Ok(urls) = std::env::var("RELAYQ_REDIS_CLUSTER_URLS") {
        out.push(Target::RedisCluster(
            urls.split(',').map(|u| u.trim().to_owned()).collect(),
        ));
    }
    Ok(out)
}

impl Target {
    /// The factor job counts are divided by on this target: the in-memory reference
    /// model's claim scans every open job (it is built to be obviously right, not fast),
    /// so it gets a tenth of the jobs, and its figures are not comparable to the others'.
    pub fn scale(&self) -> usize {
        match self {
            Target::Memory => 10,
            _ => 1,
        }
    }

    /// A fresh handle on the target.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Backend>> {
        Ok(match self {
            Target::Memory => Arc::new(MemoryBackend::new()),
            Target::Sqlite(dir) => {
                let url = format!("sqlite://{}", dir.path().join("bench.db").display());
                Arc::new(relayq_sqlite::SqliteBackend::open(&url).await?)
            }
            Target::Postgres(url) => {
                let config = relayq_postgres::Config::default()
                    .with_schema("relayq_bench")
                    .with_max_connections(16);
                let b = relayq_postgres::PostgresBackend::connect_with(url, config).await?;
                b.migrate().await?;
                Arc::new(b)
            }
            Target::Redis(url) => Arc::new(
                relayq_redis::RedisBackend::connect_with_prefix(url, "relayq-bench").await?,
            ),
            Target::RedisCluster(urls) => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                Arc::new(relayq_redis::RedisBackend::cluster(&urls, "relayq-bench").await?)
            }
        })
    }
}
