//! [`Driven`]: a [`Subject`] made from a backend's [`Driver`], so that a backend's
//! conformance file says only what is its own: the driver, the
//! capabilities, and the URL options that keep the suite's data apart.
//!
//! ```ignore
//! struct Pg;
//!
//! impl Driven for Pg {
//!     const NAME: &'static str = "postgres";
//!     const DRIVER: &'static Driver = &relayq_postgres::DRIVER;
//!     const CAPABILITIES: &'static [Capability] = &[Capability::Notifications];
//!     fn url(server: Option<&str>) -> String {
//!         with_query(server.unwrap_or_default(), "schema=relayq_conformance")
//!     }
//! }
//!
//! relayq_conformance::suite!(DriverSubject<Pg>);
//! ```

use std::{marker::PhantomData, sync::Arc};

use relayq_core::{Backend, Driver, Migrate};

use crate::{Capability, Env, Subject, harness::Server};

/// A backend under test through its [`Driver`]; see the [module](self).
pub trait Driven: Send + Sync + 'static {
    /// The backend's name in test output: its driver's name, or another for a variant
    /// of the same driver (`redis-scripts`).
    const NAME: &'static str;
    /// The backend's driver.
    const DRIVER: &'static Driver;
    /// The server its cases need: by default the one its driver names (`None` for an
    /// embedded backend).
    const SERVER: Option<Server> = Server::needed_by(Self::DRIVER);
    /// What it can do beyond the core contract.
    const CAPABILITIES: &'static [Capability] = &[];

    /// The URL every handle of the suite opens, made once per test process from the
    /// server's (`None` for an embedded backend), with the options that keep the
    /// suite's data apart (a schema, a key prefix, a file of its own).
    fn url(server: Option<&str>) -> String;

    /// The backend at a closed loopback port, with
    /// [`UNREACHABLE_PASSWORD`](crate::UNREACHABLE_PASSWORD) in the URL, for
    /// [`Capability::Unreachable`].
    fn unreachable_url() -> Option<String> {
        None
    }

    /// A URL on the server of a namespace nobody migrated, fresh at each call, for
    /// [`Capability::Schema`].
    fn unmigrated_url(_server: Option<&str>) -> Option<String> {
        None
    }
}

/// The [`Subject`] of a [`Driven`] backend: the first handle migrates, the others
/// open as another process would; a [`Proxy`](crate::Proxy) goes in front of the
/// server's URL for [`Capability::ConnectionCut`].
pub struct DriverSubject<D> {
    url: String,
    server: Option<String>,
    driven: PhantomData<fn() -> D>,
}

impl<D: Driven> Subject for DriverSubject<D> {
    const NAME: &'static str = D::NAME;
    const SERVER: Option<Server> = D::SERVER;
    const CAPABILITIES: &'static [Capability] = D::CAPABILITIES;

    async fn open(url: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            url: D::url(url.as_deref()),
            server: url,
            driven: PhantomData,
        })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let open = D::DRIVER.open;
        let url = self.url.clone();
        let backend = open(url.clone(), Migrate::Yes).await?;
        let mut env = Env::from_shared(backend, move || {
            let url = url.clone();
            async move { Ok(open(url, Migrate::No).await?) }
        });
        if let Some(unreachable) = D::unreachable_url() {
            env = env.with_unreachable(move || open(unreachable.clone(), Migrate::No));
        }
        if D::unmigrated_url(self.server.as_deref()).is_some() {
            let server = self.server.clone();
            env = env.with_unmigrated(move || {
                let url = D::unmigrated_url(server.as_deref()).unwrap_or_default();
                open(url, Migrate::No)
            });
        }
        if D::CAPABILITIES.contains(&Capability::ConnectionCut) {
            env = env.with_proxy(self.url.clone(), move |url| async move {
                let handle: Arc<dyn Backend> = open(url, Migrate::No).await?;
                Ok(handle)
            });
        }
        Ok(env)
    }
}

/// `url` with `options` (`a=1&b=2`) added to its query.
#[must_use]
pub fn with_query(url: &str, options: &str) -> String {
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}{options}")
}
