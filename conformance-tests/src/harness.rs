//! Where the servers for backend suites come from.
//!
//! For each server: the URL in its environment variable; else, with the `docker`
//! feature, a container started by testcontainers when a Docker daemon answers; else
//! the backend's cases are skipped with one clear line on stderr. Naming the server in
//! `RELAYQ_REQUIRE` (comma-separated, e.g. `postgres,redis`) turns a skip into a
//! failure, so CI cannot pass by skipping.

use std::{
    collections::HashSet,
    io::Write,
    sync::{Mutex, OnceLock},
};

/// A server a backend suite needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Server {
    /// PostgreSQL: `RELAYQ_POSTGRES_URL`.
    Postgres,
    /// Standalone Redis: `RELAYQ_REDIS_URL`.
    Redis,
    /// Redis Cluster: `RELAYQ_REDIS_CLUSTER_URLS` (comma-separated node URLs).
    RedisCluster,
    /// SQL Server: `RELAYQ_MSSQL_URL`.
    Mssql,
}

impl Server {
    /// The name used in `RELAYQ_REQUIRE` and in skip lines.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::Mssql => "mssql",
        }
    }

    /// The environment variable holding the server's URL.
    #[must_use]
    pub fn env_var(self) -> &'static str {
        match self {
            Self::Postgres => "RELAYQ_POSTGRES_URL",
            Self::Redis => "RELAYQ_REDIS_URL",
            Self::RedisCluster => "RELAYQ_REDIS_CLUSTER_URLS",
            Self::Mssql => "RELAYQ_MSSQL_URL",
        }
    }
}

/// Whether `RELAYQ_REQUIRE` names `server`.
#[must_use]
pub fn required(server: Server) -> bool {
    std::env::var("RELAYQ_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .any(|s| s.trim() == server.name())
}

/// The URL of a running `server`, or `None` after printing one skip line (once per
/// process and server).
///
/// # Panics
/// When the server is unavailable and `RELAYQ_REQUIRE` names it.
pub async fn server_url(server: Server) -> Option<String> {
    if let Ok(url) = std::env::var(server.env_var())
        && !url.trim().is_empty()
    {
        return Some(url);
    }
    let reason = match containers::start(server).await {
        Ok(url) => return Some(url),
        Err(reason) => reason,
    };
    let line = format!(
        "SKIPPED: relayq {} conformance suite: {} is unset and {reason}",
        server.name(),
        server.env_var()
    );
    assert!(
        !required(server),
        "{line}, but RELAYQ_REQUIRE names {}",
        server.name()
    );
    skip_once(server, &line);
    None
}

fn skip_once(server: Server, line: &str) {
    static SAID: OnceLock<Mutex<HashSet<Server>>> = OnceLock::new();
    let said = SAID.get_or_init(Default::default);
    if said.lock().is_ok_and(|mut s| s.insert(server)) {
        // Straight to stderr, past the test harness's output capture: a skip must show.
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Whether a Docker daemon answers on its socket.
#[must_use]
pub fn docker_answers() -> bool {
    let path = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/var/run/docker.sock".to_owned());
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

#[cfg(feature = "docker")]
mod containers {
    use testcontainers_modules::{
        mssql_server::MssqlServer,
        postgres::Postgres,
        redis::Redis,
        testcontainers::{ContainerAsync, ImageExt, runners::AsyncRunner},
    };
    use tokio::sync::OnceCell;

    use super::Server;

    /// Containers live as long as the test process: one per server, shared by cases.
    static PG: OnceCell<Result<(ContainerAsync<Postgres>, String), String>> = OnceCell::const_new();
    static REDIS: OnceCell<Result<(ContainerAsync<Redis>, String), String>> = OnceCell::const_new();
    static MSSQL: OnceCell<Result<(ContainerAsync<MssqlServer>, String), String>> =
        OnceCell::const_new();

    pub(super) async fn start(server: Server) -> Result<String, String> {
        if !super::docker_answers() {
            return Err("no Docker daemon answers".into());
        }
        let started = match server {
            Server::Postgres => PG
                .get_or_init(|| async {
                    let c = Postgres::default()
                        .start()
                        .await
                        .map_err(|e| e.to_string())?;
                    let port = c
                        .get_host_port_ipv4(5432)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok((
                        c,
                        format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres"),
                    ))
                })
                .await
                .as_ref()
                .map(|(_, url)| url.clone()),
            Server::Redis => REDIS
                .get_or_init(|| async {
                    // The module's default image is Redis 5.0; functions (FCALL) and the
                    // ACL that the Redis backend's tests use need Redis 7.
                    let c = Redis::default()
                        .with_tag("7.2")
                        .start()
                        .await
                        .map_err(|e| e.to_string())?;
                    let port = c
                        .get_host_port_ipv4(6379)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok((c, format!("redis://127.0.0.1:{port}")))
                })
                .await
                .as_ref()
                .map(|(_, url)| url.clone()),
            Server::Mssql => MSSQL
                .get_or_init(|| async {
                    let c = MssqlServer::default()
                        .with_accept_eula()
                        .with_tag("2022-latest")
                        .start()
                        .await
                        .map_err(|e| e.to_string())?;
                    let port = c
                        .get_host_port_ipv4(1433)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok((
                        c,
                        format!(
                            "mssql://sa:{}@127.0.0.1:{port}/master?trust_cert=true",
                            MssqlServer::DEFAULT_SA_PASSWORD
                        ),
                    ))
                })
                .await
                .as_ref()
                .map(|(_, url)| url.clone()),
            Server::RedisCluster => {
                return Err("no container recipe exists for a Redis Cluster".into());
            }
        };
        started.map_err(|e| format!("starting a container failed: {e}"))
    }
}

#[cfg(not(feature = "docker"))]
mod containers {
    use super::Server;

    #[allow(clippy::unused_async)]
    pub(super) async fn start(_server: Server) -> Result<String, String> {
        Err("the `docker` feature is off".into())
    }
}
