//! Where the servers for backend suites come from.
//!
//! For each [`Server`]: the URL in its environment variable; else, where its driver
//! gives a container [`Image`] and the `docker` feature is on, a container started by
//! testcontainers when a Docker daemon answers; else its tests are reported as ignored,
//! with the reason (see [`crate::runner`]). Naming the server in `RELAYQ_REQUIRE`
//! (comma-separated, e.g. `postgres,redis`) turns that into a failure, so CI cannot pass
//! by skipping.
//!
//! A `Server` is plain data, read off a backend's [`Driver`] ([`Server::of`]); nothing
//! here lists the backends.

use std::{
    collections::HashSet,
    io::Write,
    sync::{Mutex, OnceLock},
};

use relayq_core::{Driver, driver::Image};

/// A server some tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    name: &'static str,
    env_var: &'static str,
    image: Option<Image>,
}

impl Server {
    /// A server named `name` (as written in `RELAYQ_REQUIRE`) whose URL is in the
    /// environment variable `env_var`.
    #[must_use]
    pub const fn new(name: &'static str, env_var: &'static str) -> Self {
        Self {
            name,
            env_var,
            image: None,
        }
    }

    /// The same server, started from `image` in a container when its variable is
    /// unset (with the `docker` feature, when a Docker daemon answers).
    #[must_use]
    pub const fn with_image(mut self, image: Image) -> Self {
        self.image = Some(image);
        self
    }

    /// The server `driver`'s tests need, as its [`TestServer`](relayq_core::TestServer)
    /// says; `None` for an embedded backend.
    #[must_use]
    pub const fn needed_by(driver: &Driver) -> Option<Self> {
        match driver.server {
            Some(t) => Some(Self {
                name: t.name,
                env_var: t.env_var,
                image: t.image,
            }),
            None => None,
        }
    }

    /// The server `driver`'s tests need.
    ///
    /// # Panics
    /// When the driver names none (at compile time, in a `const`).
    #[must_use]
    pub const fn of(driver: &Driver) -> Self {
        match Self::needed_by(driver) {
            Some(server) => server,
            None => panic!("this driver's backend needs no server"),
        }
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
    if let Some(url) = relayq_testenv::url(server.env_var) {
        return Ok(url);
    }
    let why = match server.image {
        None => "no container image".to_owned(),
        Some(image) => match containers::start(server.name, image).await {
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

/// Servers in containers, from a driver's [`Image`].
mod containers {
    use relayq_core::driver::Image;

    #[cfg(feature = "docker")]
    pub(super) async fn start(name: &'static str, image: Image) -> Result<String, String> {
        use std::{
            collections::HashMap,
            sync::{Arc, Mutex, PoisonError},
        };

        use testcontainers_modules::testcontainers::{
            ContainerAsync, ContainerRequest, GenericImage, ImageExt,
            core::{IntoContainerPort, WaitFor},
            runners::AsyncRunner,
        };
        use tokio::sync::OnceCell;

        type Started = Arc<OnceCell<Result<(ContainerAsync<GenericImage>, String), String>>>;
        /// Containers live as long as the test process: one per server, shared by tests.
        static STARTED: Mutex<Option<HashMap<&'static str, Started>>> = Mutex::new(None);

        if !super::docker_answers() {
            return Err("no Docker daemon".into());
        }
        let cell = STARTED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .entry(name)
            .or_default()
            .clone();
        cell.get_or_init(|| async move {
            let mut generic =
                GenericImage::new(image.name, image.tag).with_exposed_port(image.port.tcp());
            for ready in image.ready {
                generic = generic.with_wait_for(match *ready {
                    relayq_core::driver::Ready::Stdout(line) => WaitFor::message_on_stdout(line),
                    relayq_core::driver::Ready::Stderr(line) => WaitFor::message_on_stderr(line),
                });
            }
            let mut request = ContainerRequest::from(generic);
            for (k, v) in image.env {
                request = request.with_env_var(*k, *v);
            }
            let c = request.start().await.map_err(|e| e.to_string())?;
            let port = c
                .get_host_port_ipv4(image.port)
                .await
                .map_err(|e| e.to_string())?;
            Ok((c, image.url_at(port)))
        })
        .await
        .as_ref()
        .map(|(_, url)| url.clone())
        .map_err(|e| format!("its container failed: {e}"))
    }

    #[cfg(not(feature = "docker"))]
    #[allow(
        clippy::unused_async,
        reason = "the same signature as with the feature"
    )]
    pub(super) async fn start(_name: &'static str, _image: Image) -> Result<String, String> {
        Err("`docker` feature off".into())
    }
}
