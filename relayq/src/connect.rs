//! A URL → the backend it names: the one list of this repository's backends, and the
//! drivers registered by backends from outside it.

use std::sync::{Arc, PoisonError, RwLock};

use relayq_core::{Backend, Driver, Error, Result};

pub use relayq_core::Migrate;

/// A backend of this repository: the cargo feature that builds it in, its URL schemes
/// (for the hint when the feature is off: the driver is not compiled then), and its
/// driver when this build has it.
struct Built {
    feature: &'static str,
    schemes: &'static [&'static str],
    driver: Option<&'static Driver>,
}

/// A [`Built`], with the driver when its feature is on.
macro_rules! built {
    ($feature:literal, $schemes:expr, $driver:path) => {{
        #[cfg(feature = $feature)]
        let driver = Some(&$driver);
        #[cfg(not(feature = $feature))]
        let driver = None;
        Built {
            feature: $feature,
            schemes: &$schemes,
            driver,
        }
    }};
}

/// Every backend of this repository. The one list of backends in the Rust source: a
/// new backend adds its line here (see `docs/WRITING-A-BACKEND.md`); a test checks
/// that the schemes are its driver's.
static BACKENDS: &[Built] = &[
    built!("sqlite", ["sqlite"], relayq_sqlite::DRIVER),
    built!(
        "postgres",
        ["postgres", "postgresql"],
        relayq_postgres::DRIVER
    ),
    built!("redis", ["redis", "rediss"], relayq_redis::DRIVER),
    built!("redis", ["redis-cluster"], relayq_redis::CLUSTER_DRIVER),
    built!("mssql", ["mssql", "sqlserver"], relayq_mssql::DRIVER),
    built!("mysql", ["mysql", "mariadb"], relayq_mysql::DRIVER),
    Built {
        feature: "",
        schemes: &["memory"],
        driver: Some(&relayq_core::memory::DRIVER),
    },
];

/// Drivers added by [`register`].
static REGISTERED: RwLock<Vec<&'static Driver>> = RwLock::new(Vec::new());

/// Adds a backend from outside this repository, so that [`connect`] in this process
/// (and a program built on it, such as a copy of the `relayq` CLI that registers the
/// driver in its `main`) opens its URLs. A driver registered later wins over an
/// earlier one, and over a built-in one, for the schemes they share.
pub fn register(driver: &'static Driver) {
    REGISTERED
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .push(driver);
}

/// Every driver this program can open: the registered ones (newest first), then the
/// built-in ones.
#[must_use]
pub fn drivers() -> Vec<&'static Driver> {
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    registered
        .iter()
        .rev()
        .copied()
        .chain(BACKENDS.iter().filter_map(|b| b.driver))
        .collect()
}

/// The driver that opens `url`, if this program has one.
#[must_use]
pub fn driver_for(url: &str) -> Option<&'static Driver> {
    drivers().into_iter().find(|d| d.handles(url))
}

/// The URL schemes this program can open, for messages: `sqlite://`, ...
#[must_use]
pub fn schemes() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in drivers() {
        for s in d.schemes {
            let s = format!("{s}://");
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
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
    match driver_for(url) {
        Some(driver) => (driver.open)(url.to_owned(), migrate).await,
        None => Err(unknown(scheme)),
    }
}

fn unknown(scheme: &str) -> Error {
    let missing: Vec<&Built> = BACKENDS.iter().filter(|b| b.driver.is_none()).collect();
    if let Some(b) = missing.iter().find(|b| b.schemes.contains(&scheme)) {
        return Error::invalid(
            "url",
            format!(
                "{scheme}:// is not built into this program: enable relayq's `{}` feature",
                b.feature
            ),
        );
    }
    let mut features: Vec<&str> = missing.iter().map(|b| b.feature).collect();
    features.dedup();
    let mut reason = format!(
        "unknown scheme {scheme}://: this program has {}",
        schemes().join(", ")
    );
    if !features.is_empty() {
        reason.push_str(&format!(
            "; relayq's cargo features {} add more",
            features.join(", ")
        ));
    }
    Error::invalid("url", reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend from outside the repository: in-memory, under a scheme of its own.
    static OUTSIDE: Driver = Driver {
        name: "outside",
        schemes: &["outside-test"],
        feature: "",
        example_url: "outside-test://",
        open: |_, _| {
            Box::pin(async {
                Ok(Arc::new(relayq_core::memory::MemoryBackend::new()) as Arc<dyn Backend>)
            })
        },
        server: None,
    };

    #[tokio::test]
    async fn a_registered_driver_opens_its_urls_and_is_listed() {
        let before = connect("outside-test://").await.err();
        assert_eq!(
            before.as_ref().and_then(Error::invalid_field),
            Some("url"),
            "{before:?}"
        );
        register(&OUTSIDE);
        assert!(connect("outside-test://").await.is_ok());
        assert!(schemes().contains(&"outside-test://".to_owned()));
        assert_eq!(
            driver_for("outside-test://x").map(|d| d.name),
            Some("outside")
        );
    }

    #[test]
    fn the_hint_schemes_are_the_drivers_own() {
        for b in BACKENDS {
            if let Some(d) = b.driver {
                assert_eq!(b.schemes, d.schemes, "{}", d.name);
            }
        }
    }

    /// The default build has SQLite only: another backend's every scheme names its
    /// feature, `sqlserver://` as well as `mssql://`.
    #[cfg(not(feature = "mssql"))]
    #[tokio::test]
    async fn a_scheme_left_out_of_the_build_names_its_feature() {
        for url in ["mssql://h/db", "sqlserver://h/db"] {
            let Err(e) = connect(url).await else {
                panic!("{url} opened")
            };
            assert!(
                e.to_string().contains("enable relayq's `mssql` feature"),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_schemes_and_missing_schemes_name_the_url() {
        let Err(e) = connect("nosuch://x").await else {
            panic!("nosuch:// opened")
        };
        assert_eq!(e.invalid_field(), Some("url"));
        assert!(e.to_string().contains("unknown scheme nosuch://"), "{e}");
        let Err(e) = connect("relayq.db").await else {
            panic!("a path without a scheme opened")
        };
        assert!(e.to_string().contains("no scheme"), "{e}");
    }
}
