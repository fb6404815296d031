//! Where the servers for backend suites come from.
//!
//! For each [`Server`]: the URL in its environment variable; else, where it has a
//! container recipe and the `docker` feature is on, a container started by
//! testcontainers when a Docker daemon answers; else its tests are reported as ignored,
//! with the reason (see [`crate::runner`]). Naming the server in `RELAYQ_REQUIRE`
//! (comma-separated, e.g. `postgres,redis`) turns that into a failure, so CI cannot pass
//! by skipping.
//!
//! A `Server` is plain data: a new backend's tests define their own with
//! [`Server::new`]; nothing here lists the backends.

use std::{
    collections::HashSet,
    io::Write,
    sync::{Mutex, OnceLock},
};

use futures::future::BoxFuture;

/// Starts a container and returns its URL, or why it could not.
pub type Container = fn() -> BoxFuture<'static, Result<String, String>>;

/// A server some tests need.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    name: &'static str,
    env_var: &'static str,
    container: Option<Container>,
}

#[allow(
    non_upper_case_globals,
    reason = "named like the enum variants they replace, so the unit tests inside the \
              backend crates (`server_url(Server::Postgres)`) keep compiling"
)]
impl Server {
    /// PostgreSQL: `RELAYQ_POSTGRES_URL`, or a container.
    pub const Postgres: Self =
        Self::new("postgres", "RELAYQ_POSTGRES_URL").with_container(containers::postgres);
    /// Standalone Redis: `RELAYQ_REDIS_URL`, or a container.
    pub const Redis: Self =
        Self::new("redis", "RELAYQ_REDIS_URL").with_container(containers::redis);
    /// Redis Cluster: `RELAYQ_REDIS_CLUSTER_URLS` (comma-separated node URLs).
    pub const RedisCluster: Self = Self::new("redis-cluster", "RELAYQ_REDIS_CLUSTER_URLS");
    /// SQL Server: `RELAYQ_MSSQL_URL`, or a container.
    pub const Mssql: Self =
        Self::new("mssql", "RELAYQ_MSSQL_URL").with_container(containers::mssql);

    /// A server named `name` (as written in `RELAYQ_REQUIRE`) whose URL is in the
    /// environment variable `env_var`.
    #[must_use]
    pub const fn new(name: &'static str, env_var: &'static str) -> Self {
        Self {
            name,
            env_var,
            container: None,
        }
    }

    /// The same server, started by `container` when its variable is unset.
    #[must_use]
    pub const fn with_container(mut self, container: Container) -> Self {
        self.container = Some(container);
        self
    }

    /// The name used in `RELAYQ_REQUIRE` and in skip reasons.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.name
    }

    /// The environment variable holding the server's URL.
    #[must_use]
    pub fn env_var(self) -> &'static str {
        self.env_var
    }
}

/// Whether `RELAYQ_REQUIRE` names `server`.
#[must_use]
pub fn required(server: Server) -> bool {
    relayq_core::driver::required(server.name)
}

/// Whether the comma-separated `list` names `server`.
#[must_use]
pub fn names(list: &str, server: Server) -> bool {
    relayq_core::driver::names(list, server.name)
}

/// The URL of a running `server`, or why there is none (`RELAYQ_REQUIRE` is not
/// consulted: the caller decides whether that skips or fails).
///
/// # Errors
/// The reason, when the variable is unset and no container could be started.
pub async fn locate(server: Server) -> Result<String, String> {
    if let Ok(url) = std::env::var(server.env_var)
        && !url.trim().is_empty()
    {
        return Ok(url);
    }
    let why = match server.container {
        None => "no container recipe".to_owned(),
        Some(start) => match start().await {
            Ok(url) => return Ok(url),
            Err(why) => why,
        },
    };
    Err(format!("{} unset, {why}", server.env_var))
}

/// The URL of a running `server`, or `None` after printing one skip line (once per
/// process and server).
///
/// Prefer the [`crate::runner`], which reports a test without its server as ignored: a
/// test that returned early on `None` would count as passed. This serves the unit tests
/// inside the backend crates, which their `build.rs` compiles as ignored when the URL is
/// unset, and which expect the URL when they run.
///
/// # Panics
/// When the server is unavailable and `RELAYQ_REQUIRE` names it.
pub async fn server_url(server: Server) -> Option<String> {
    let reason = match locate(server).await {
        Ok(url) => return Some(url),
        Err(reason) => reason,
    };
    let line = format!("SKIPPED: relayq {} tests: {reason}", server.name);
    assert!(
        !required(server),
        "{line}, but RELAYQ_REQUIRE names {}",
        server.name
    );
    skip_once(server, &line);
    None
}

fn skip_once(server: Server, line: &str) {
    static SAID: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let said = SAID.get_or_init(Default::default);
    if said.lock().is_ok_and(|mut s| s.insert(server.name)) {
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

/// Container recipes for the servers of this repository's backends; a new backend may
/// add its own recipe in its tests, or have none (its URL variable is then the only
/// way in).
pub mod containers {
    #[cfg(feature = "docker")]
    pub use with_docker::{mssql, postgres, redis};
    #[cfg(not(feature = "docker"))]
    pub use without_docker::{mssql, postgres, redis};

    #[cfg(feature = "docker")]
    mod with_docker {
        use futures::future::BoxFuture;
        use testcontainers_modules::{
            mssql_server::MssqlServer,
            postgres::Postgres,
            redis::Redis,
            testcontainers::{ContainerAsync, ImageExt, runners::AsyncRunner},
        };
        use tokio::sync::OnceCell;

        type Started<I> = OnceCell<Result<(ContainerAsync<I>, String), String>>;

        /// Containers live as long as the test process: one per server, shared by tests.
        static PG: Started<Postgres> = OnceCell::const_new();
        static REDIS: Started<Redis> = OnceCell::const_new();
        static MSSQL: Started<MssqlServer> = OnceCell::const_new();

        async fn start<I: testcontainers_modules::testcontainers::Image>(
            cell: &'static Started<I>,
            image: impl AsyncRunner<I>,
            port: u16,
            url: impl FnOnce(u16) -> String,
        ) -> Result<String, String> {
            if !crate::harness::docker_answers() {
                return Err("no Docker daemon".into());
            }
            cell.get_or_init(|| async {
                let c = image.start().await.map_err(|e| e.to_string())?;
                let port = c
                    .get_host_port_ipv4(port)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((c, url(port)))
            })
            .await
            .as_ref()
            .map(|(_, url)| url.clone())
            .map_err(|e| format!("its container failed: {e}"))
        }

        /// PostgreSQL in a container.
        pub fn postgres() -> BoxFuture<'static, Result<String, String>> {
            Box::pin(start(&PG, Postgres::default(), 5432, |port| {
                format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres")
            }))
        }

        /// Redis 7.2 in a container: the module's default image is Redis 5.0, and
        /// functions (FCALL) and the ACL that the Redis backend's tests use need Redis 7.
        pub fn redis() -> BoxFuture<'static, Result<String, String>> {
            Box::pin(start(
                &REDIS,
                Redis::default().with_tag("7.2"),
                6379,
                |port| format!("redis://127.0.0.1:{port}"),
            ))
        }

        /// SQL Server 2022 in a container.
        pub fn mssql() -> BoxFuture<'static, Result<String, String>> {
            let image = MssqlServer::default()
                .with_accept_eula()
                .with_tag("2022-latest");
            Box::pin(start(&MSSQL, image, 1433, |port| {
                format!(
                    "mssql://sa:{}@127.0.0.1:{port}/master?trust_cert=true",
                    MssqlServer::DEFAULT_SA_PASSWORD
                )
            }))
        }
    }

    #[cfg(not(feature = "docker"))]
    mod without_docker {
        use futures::future::BoxFuture;

        fn off() -> BoxFuture<'static, Result<String, String>> {
            Box::pin(async { Err("`docker` feature off".into()) })
        }

        /// PostgreSQL in a container: not without the `docker` feature.
        pub fn postgres() -> BoxFuture<'static, Result<String, String>> {
            off()
        }

        /// Redis in a container: not without the `docker` feature.
        pub fn redis() -> BoxFuture<'static, Result<String, String>> {
            off()
        }

        /// SQL Server in a container: not without the `docker` feature.
        pub fn mssql() -> BoxFuture<'static, Result<String, String>> {
            off()
        }
    }
}
