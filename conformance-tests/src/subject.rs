//! The seam between the suite and a backend: a [`Subject`] says what the backend is
//! called, which server it needs, what it can do beyond the core contract, and how to
//! make an [`Env`] for one case. [`suite!`](crate::suite) then runs every case, and the
//! model check, against it.

use std::fmt;

use crate::{Env, harness::Server};

/// A backend under test.
///
/// `open` runs once per test process, on the first case that runs, with the server's
/// URL (`None` for an embedded backend). Keep only plain data in `Self` (URLs, names):
/// each case runs on a runtime of its own, so a pool made in `open` would outlive the
/// runtime that drives it.
#[allow(
    async_fn_in_trait,
    reason = "the runner drives these futures with `block_on`, which needs no `Send`"
)]
pub trait Subject: Sized + Send + Sync + 'static {
    /// The backend's name in test output and skip reasons: `"postgres"`.
    const NAME: &'static str;
    /// The server it needs; `None` for an embedded backend.
    const SERVER: Option<Server> = None;
    /// What it can do beyond the core contract; cases that need more are skipped.
    const CAPABILITIES: &'static [Capability] = &[];

    /// One-time setup against the server at `url` (a schema to migrate, a user to
    /// create). An error fails every case, but a [`Skip`] reports them as ignored with
    /// its reason.
    async fn open(url: Option<String>) -> anyhow::Result<Self>;

    /// An environment for one case: a handle and a way to open more.
    async fn env(&self) -> anyhow::Result<Env>;
}

/// Optional behaviour, which some cases need. A case that needs one the subject does
/// not declare is reported as ignored, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// `Events::subscribe` returns a receiver, and an enqueue or a finished job on one
    /// handle wakes the subscribers of another (SPEC B5, W2): `LISTEN/NOTIFY`, pub/sub,
    /// or an in-process bus shared by the handles on one store.
    Notifications,
    /// The backend talks to a server, and the subject's [`Env`] can open a handle
    /// against one that refuses connections ([`Env::with_unreachable`]), for SPEC X4.
    Unreachable,
    /// The backend talks to its server over TCP, and the subject's [`Env`] can open a
    /// handle at a URL whose host and port it is given ([`Env::with_proxy`]): the X3
    /// case puts a [`Proxy`](crate::Proxy) in between and cuts its connections
    /// mid-operation.
    ConnectionCut,
    /// The backend keeps a schema that it migrates, and the subject's [`Env`] can open a
    /// handle, without migrating, on a namespace nobody migrated
    /// ([`Env::with_unmigrated`]), for SPEC X1's `Schema`.
    Schema,
    /// Jobs may carry a limit key and claims keep each key under its limit (SPEC K).
    LimitKeys,
    /// Queues may have a rate, and claims keep to it (SPEC K8–K11).
    Rates,
    /// Limit keys may have rates, and claims keep to them (SPEC K12–K14).
    KeyRates,
    /// A full key's backlog of any length holds up no claim, from the first one on
    /// (SPEC K4), for a key of limit 1 at least: jobs behind a long backlog of their
    /// key are parked as they arrive.
    /// Without it, claims park a bounded number per read, and other keys' jobs behind
    /// thousands of a full key's wait a few claims.
    KeyBacklogs,
    /// Jobs of a batch may run after others of it (SPEC D).
    Dependencies,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Notifications => "notifications",
            Self::Unreachable => "unreachable-server",
            Self::ConnectionCut => "connection-cut",
            Self::Schema => "schema",
            Self::LimitKeys => "limit-keys",
            Self::Rates => "rates",
            Self::KeyRates => "key-rates",
            Self::KeyBacklogs => "key-backlogs",
            Self::Dependencies => "dependencies",
        })
    }
}

/// An error from [`Subject::open`] that skips the subject's cases instead of failing
/// them: the server is there but cannot run this variant of the suite.
#[derive(Debug)]
pub struct Skip(pub String);

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}
