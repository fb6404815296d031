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
//! assert_eq!(memory.server, None);
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestServer {
    /// The name `RELAYQ_REQUIRE` uses: `postgres`, `redis-cluster`.
    pub name: &'static str,
    /// The environment variable holding the server's URL: `RELAYQ_POSTGRES_URL`.
    pub env_var: &'static str,
}

impl TestServer {
    /// The server's URL from its environment variable, when set and not blank.
    #[must_use]
    pub fn url(&self) -> Option<String> {
        std::env::var(self.env_var)
            .ok()
            .filter(|url| !url.trim().is_empty())
    }

    /// Whether `RELAYQ_REQUIRE` (comma-separated names) names this server: its tests
    /// then fail without it instead of being reported as ignored.
    #[must_use]
    pub fn required(&self) -> bool {
        required(self.name)
    }
}

/// Whether the comma-separated `RELAYQ_REQUIRE` names `name`. The one place that reads
/// the variable.
#[must_use]
pub fn required(name: &str) -> bool {
    names(&std::env::var("RELAYQ_REQUIRE").unwrap_or_default(), name)
}

/// Whether the comma-separated `list` names `name`.
#[must_use]
pub fn names(list: &str, name: &str) -> bool {
    list.split(',').any(|s| s.trim() == name)
}

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
    }
}
