//! [`Driver`]: what a backend crate tells the rest of relayq about itself, in one
//! place, as sqlx's `AnyDriver` does: its URL schemes, the facade's cargo feature that
//! builds it in, an example URL, how to open it from a URL, and where its tests find a
//! server. The facade (`relayq::connect`, `relayq::drivers`), the CLI's `--db` and its
//! help, and the conformance suite's `Driven` subjects open backends through these.
//!
//! ```
//! use relayq_core::{Driver, Migrate};
//! let memory = &relayq_core::memory::DRIVER;
//! assert!(memory.handles("memory://"));
//! assert!(memory.server.is_none());
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let backend = (memory.open)("memory://".into(), Migrate::Yes).await.unwrap();
//! # let _ = backend; });
//! ```

use std::{future::Future, pin::Pin, sync::Arc};

use crate::{Backend, Result};

/// What [`Driver::open`] returns.
pub type Opening = Pin<Box<dyn Future<Output = Result<Arc<dyn Backend>>> + Send>>;

/// Whether opening a backend creates or updates its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrate {
    /// Run the backend's migrations (idempotent, safe from many processes at once).
    Yes,
    /// Leave the schema alone: for tools that only read, which then fail with a clear
    /// error naming `migrate()` when the schema is missing or older.
    No,
}

/// A backend, as the rest of relayq sees it (see the [module](self)).
#[derive(Clone, Copy)]
pub struct Driver {
    /// Short name, as in messages: `postgres`.
    pub name: &'static str,
    /// The URL schemes it opens, without `://`: `["postgres", "postgresql"]`.
    pub schemes: &'static [&'static str],
    /// The cargo feature of the `relayq` crate that builds it in; empty when always
    /// there.
    pub feature: &'static str,
    /// An example URL for help texts: `postgres://USER:PASSWORD@HOST:PORT/DB`.
    pub example_url: &'static str,
    /// Opens the backend `url` names, taking relayq's own query options (see
    /// [`url_options`](crate::kit::url_options)) out first.
    pub open: fn(url: String, migrate: Migrate) -> Opening,
    /// The server its tests need, when it needs one.
    pub server: Option<TestServer>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Whether `url` (or a bare scheme) is one of this driver's.
    #[must_use]
    pub fn handles(&self, url: &str) -> bool {
        let scheme = url.split_once("://").map_or(url, |(s, _)| s);
        self.schemes.contains(&scheme)
    }
}

/// Where a backend's tests find their server.
#[derive(Debug, Clone, Copy)]
pub struct TestServer {
    /// The name `RELAYQ_REQUIRE` uses: `postgres`, `redis-cluster`.
    pub name: &'static str,
    /// The environment variable holding the server's URL: `RELAYQ_POSTGRES_URL`.
    pub env_var: &'static str,
    /// A container image that runs the server, for test harnesses that start one when
    /// the variable is unset.
    pub image: Option<Image>,
    /// Turns the variable's value into a URL the driver opens, when it is not one
    /// already (a cluster's variable lists its nodes).
    pub to_url: Option<fn(&str) -> String>,
}

impl TestServer {
    /// The server's URL from its environment variable, when set and not blank.
    #[must_use]
    pub fn url(&self) -> Option<String> {
        relayq_testenv::url(self.env_var)
    }

    /// A URL the driver opens, made from the server's environment variable, when set:
    /// for tools that run any backend whose server is given (the bench, the CLI's
    /// tests).
    #[must_use]
    pub fn open_url(&self) -> Option<String> {
        let url = self.url()?;
        Some(self.to_url.map_or(url.clone(), |to_url| to_url(&url)))
    }

    /// Whether `RELAYQ_REQUIRE` (comma-separated names) names this server: its tests
    /// then fail without it instead of being reported as ignored.
    #[must_use]
    pub fn required(&self) -> bool {
        required(self.name)
    }
}

/// A container image that runs a backend's server for its tests, as plain data: the
/// conformance harness starts it (its `docker` feature) when a Docker daemon answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Image {
    /// The image's name: `postgres`.
    pub name: &'static str,
    /// Its tag: `16`.
    pub tag: &'static str,
    /// The port the server listens on inside the container.
    pub port: u16,
    /// Environment variables the image needs.
    pub env: &'static [(&'static str, &'static str)],
    /// Log lines that, all seen, mean the server is ready.
    pub ready: &'static [Ready],
    /// The server's URL, with `{port}` for the port it is mapped to on loopback.
    pub url: &'static str,
}

/// A log line an [`Image`]'s container prints when ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// On its standard output.
    Stdout(&'static str),
    /// On its standard error.
    Stderr(&'static str),
}

impl Image {
    /// [`Image::url`] for the server mapped to `port` on loopback.
    #[must_use]
    pub fn url_at(&self, port: u16) -> String {
        self.url.replace("{port}", &port.to_string())
    }
}

/// Whether the comma-separated `RELAYQ_REQUIRE` names `name`.
pub use relayq_testenv::{names, required};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_matched_whole() {
        let d = crate::memory::DRIVER;
        assert!(d.handles("memory://"));
        assert!(d.handles("memory"));
        assert!(!d.handles("memoryx://"));
        assert!(names("postgres, redis", "redis"));
        assert!(!names("redis-cluster", "redis"));
        let image = Image {
            name: "x",
            tag: "1",
            port: 1,
            env: &[],
            ready: &[],
            url: "x://127.0.0.1:{port}/db",
        };
        assert_eq!(image.url_at(5432), "x://127.0.0.1:5432/db");
    }
}
