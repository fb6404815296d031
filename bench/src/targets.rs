//! The backends to measure: always memory and SQLite; every backend with a server
//! where its URL is set (read off `relayq::drivers()`, so a new backend is measured
//! without a change here).

use std::sync::Arc;

use relayq::{Backend, Driver};

pub enum Target {
    Memory,
    Sqlite(tempfile::TempDir),
    Postgres(String),
    Redis(String),
    RedisCluster(Vec<String>),
    Mssql(String),
    /// A backend the bench knows nothing special of (no raw loop, no peers, no
    /// namespace of its own): opened through its driver, at its server's URL.
    Other(&'static Driver, String),
}

pub async fn available() -> anyhow::Result<Vec<Target>> {
    let mut out = vec![Target::Memory, Target::Sqlite(tempfile::tempdir()?)];
    for driver in relayq::drivers() {
        let Some(server) = driver.server else {
            continue;
        };
        let (Some(url), Some(open_url)) = (server.url(), server.open_url()) else {
            continue;
        };
        out.push(match driver.name {
            "postgres" => Target::Postgres(url),
            "redis" => Target::Redis(url),
            "redis-cluster" => {
                Target::RedisCluster(url.split(',').map(|u| u.trim().to_owned()).collect())
            }
            "mssql" => Target::Mssql(url),
            _ => Target::Other(driver, open_url),
        });
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

    /// Two handles on one store: a producer and a consumer. Separate connections where
    /// the backend has them (so wake-ups cross its notification path); the same
    /// instance for the in-memory model, whose handles do not share a store.
    pub async fn open_pair(&self) -> anyhow::Result<(Arc<dyn Backend>, Arc<dyn Backend>)> {
        match self {
            Target::Memory => {
                let b = self.open().await?;
                Ok((b.clone(), b))
            }
            _ => Ok((self.open().await?, self.open().await?)),
        }
    }

    /// A handle on a namespace of its own (schema, key prefix or database file) and
    /// what removes it afterwards.
    pub async fn open_isolated(&self, ns: &str) -> anyhow::Result<(Arc<dyn Backend>, Cleanup)> {
        Ok(match self {
            // SQL Server's backlog stays in the shared bench schema; its queue name is
            // fresh, and `maintain` prunes what finished.
            Target::Memory | Target::Mssql(_) | Target::Other(..) => {
                (self.open().await?, Cleanup::None)
            }
            Target::RedisCluster(urls) => {
                let prefix = format!("relayq-bench-{ns}");
                let b = relayq::connect(&cluster_url(urls, &prefix)).await?;
                (b, Cleanup::Keys(urls.clone(), prefix))
            }
            Target::Sqlite(dir) => {
                let path = dir.path().join(format!("{ns}.db"));
                let b = relayq::connect(&format!("sqlite://{}", path.display())).await?;
                (b, Cleanup::File(path))
            }
            Target::Postgres(url) => {
                vacuum(url).await?;
                let schema = format!("relayq_bench_{ns}");
                let b = relayq::connect(&with(url, &format!("schema={schema}&max_connections=16")))
                    .await?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url)
                    .await?;
                (b, Cleanup::Schema(pool, schema))
            }
            Target::Redis(url) => {
                let prefix = format!("relayq-bench-{ns}");
                let b = relayq::connect(&with(url, &format!("prefix={prefix}"))).await?;
                (b, Cleanup::Keys(vec![url.clone()], prefix))
            }
        })
    }

    /// A fresh handle on the target, through `relayq::connect` as an application's.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Backend>> {
        let url = match self {
            Target::Memory => "memory://".to_owned(),
            Target::Sqlite(dir) => format!("sqlite://{}", dir.path().join("bench.db").display()),
            Target::Postgres(url) => {
                vacuum(url).await?;
                with(url, "schema=relayq_bench&max_connections=16")
            }
            Target::Redis(url) => with(url, "prefix=relayq-bench"),
            Target::RedisCluster(urls) => cluster_url(urls, "relayq-bench"),
            Target::Mssql(url) => with(url, "schema=relayq_bench&max_connections=16"),
            Target::Other(_, url) => url.clone(),
        };
        Ok(relayq::connect(&url).await?)
    }
}

/// `url` with relayq's `option` (`key=value&...`) added to its query.
fn with(url: &str, option: &str) -> String {
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}{option}")
}

/// The facade's URL of a cluster whose nodes are `urls` (`redis://host:port` each).
fn cluster_url(urls: &[String], prefix: &str) -> String {
    let hosts: Vec<&str> = urls
        .iter()
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    format!("redis-cluster://{}/?prefix={prefix}", hosts.join(","))
}

/// Vacuums the whole PostgreSQL database, run before every PostgreSQL measurement
/// (ours, the raw loop's and each peer's).
///
/// The server here runs with `autovacuum = off`. Without it, the dead rows of earlier
/// runs pile up (2.2 million in the bench schema after a few drains) and every later
/// measurement, ours or a peer's, slows by a different amount. A database-wide `VACUUM`
/// gives each one the clean tables autovacuum keeps on a production server; on clean
/// tables it takes a fraction of a second.
pub async fn vacuum(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("VACUUM").execute(&mut c).await?;
    c.close().await?;
    Ok(())
}

/// What [`Target::open_isolated`] made, to remove.
pub enum Cleanup {
    None,
    File(std::path::PathBuf),
    Schema(sqlx::PgPool, String),
    /// Every key under a prefix, on each of these nodes. A namespace holds one queue,
    /// so its keys share one hash slot and can go in multi-key `UNLINK`s.
    Keys(Vec<String>, String),
}

impl Cleanup {
    /// Refreshes the planner's statistics of the namespace's tables, as autovacuum's
    /// autoanalyze (PostgreSQL) or `PRAGMA optimize` (SQLite) would.
    pub async fn analyze(&self) -> anyhow::Result<()> {
        match self {
            Cleanup::File(path) => {
                let url = format!("sqlite://{}", path.display());
                let pool = sqlx::SqlitePool::connect(&url).await?;
                sqlx::raw_sql("ANALYZE").execute(&pool).await?;
                pool.close().await;
            }
            Cleanup::Schema(pool, schema) => {
                for t in ["jobs", "finished", "attempts", "batches", "queues"] {
                    let sql = format!("ANALYZE \"{schema}\".{t}");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(pool)
                        .await?;
                }
            }
            Cleanup::None | Cleanup::Keys(..) => {}
        }
        Ok(())
    }

    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Cleanup::None => {}
            Cleanup::File(path) => {
                for ext in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
                }
            }
            Cleanup::Schema(pool, schema) => {
                let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await?;
            }
            Cleanup::Keys(urls, prefix) => {
                for url in urls {
                    unlink_prefix(&url, &prefix).await?;
                }
            }
        }
        Ok(())
    }
}

/// Removes every key under `prefix` on the node at `url`.
async fn unlink_prefix(url: &str, prefix: &str) -> anyhow::Result<()> {
    // SCAN, not KEYS, and no response timeout: a million jobs' keys take a while to
    // list and to unlink.
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut c = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut c)
            .await?;
        keys.extend(found);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    // On a cluster node one UNLINK may only name keys of one slot: group them by hash
    // tag (a queue's keys share `{queue}`; `<prefix>:queues` has none and goes alone).
    let mut by_tag: std::collections::BTreeMap<&str, Vec<&String>> = Default::default();
    for key in &keys {
        by_tag.entry(hash_tag(key)).or_default().push(key);
    }
    for group in by_tag.values() {
        for chunk in group.chunks(500) {
            redis::cmd("UNLINK")
                .arg(chunk)
                .query_async::<()>(&mut c)
                .await?;
        }
    }
    Ok(())
}

/// The part of `key` Redis Cluster hashes: the first `{...}` with something inside, or
/// the whole key.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn keys_group_by_their_hash_tag() {
        assert_eq!(hash_tag("relayq:{q1}:job:7"), "q1");
        assert_eq!(hash_tag("relayq:queues"), "relayq:queues");
        // An empty tag hashes the whole key, as Redis does.
        assert_eq!(hash_tag("a:{}:b"), "a:{}:b");
    }
}
