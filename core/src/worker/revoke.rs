//! How the keeper learns that a running job was cancelled, in well under a heartbeat
//! (SPEC B8): from the backend's [`EventKind::Revoked`] where every cancel reaches it
//! ([`Events::pushes_revocations`](crate::Events::pushes_revocations)), and otherwise
//! from a cheap read of its leases, [`lost_leases`](crate::Complete::lost_leases), every
//! poll interval while it holds any. Never by beating more often: a beat writes, the
//! read does not.
//!
//! One check runs at a time; a reason to check that comes while one runs makes
//! another follow it, so a cancel committed after a check's read began is not missed.
//! A job that starts after a cancel of its queue was heard, but was claimed before it,
//! is checked as it starts; a check that fails is tried again after [`RETRY`].
//!
//! While a push backend's listener reconnects, cancels are not heard: its workers read
//! their leases every [`BACKSTOP`] as well, and its `Resync` once it listens again
//! makes every lease be checked.

use std::{collections::HashSet, sync::Arc, time::Duration};

use tokio::sync::broadcast::{self, error::RecvError};

use crate::{Backend, Error, Event, EventKind, JobId, Lease, Result, validate::MAX_SETTLE};

/// How often a worker on a push backend reads its leases all the same: a cancel sent
/// while its listener was away (a cut connection, a server restart) is heard within
/// this, not only once it listens again.
pub(super) const BACKSTOP: Duration = Duration::from_secs(1);

/// How long after a failed check the keeper checks again.
pub(super) const RETRY: Duration = Duration::from_millis(250);

/// Default interval of the lease read on backends that cannot push cancels.
pub const DEFAULT_CANCEL_POLL: Duration = Duration::from_millis(50);

/// Where the keeper hears of cancels.
pub(super) struct Watch {
    events: Option<broadcast::Receiver<Event>>,
    /// How often to read the leases while holding any: `cancel_poll` where cancels are
    /// not pushed; [`BACKSTOP`] where they are.
    pub(super) poll: Option<Duration>,
}

impl Watch {
    pub(super) fn new(backend: &dyn Backend, poll: Duration) -> Self {
        let pushed = backend.pushes_revocations();
        Self {
            events: backend.subscribe(),
            poll: Some(if pushed { BACKSTOP.max(poll) } else { poll }),
        }
    }

    /// The next event that may mean a cancel: `Revoked` for some queue, or `None` for
    /// "any queue" (a resync, or events lost to lag). Pending forever without events.
    pub(super) async fn next(&mut self) -> Option<Arc<str>> {
        loop {
            let Some(rx) = &mut self.events else {
                return std::future::pending().await;
            };
            match rx.recv().await {
                Ok(e) if e.kind == EventKind::Revoked => return Some(e.queue),
                Ok(e) if e.kind == EventKind::Resync => return None,
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => return None,
                Err(RecvError::Closed) => self.events = None,
            }
        }
    }
}

/// The reason for the next check: which queues, or all.
#[derive(Default)]
pub(super) struct Due {
    all: bool,
    queues: HashSet<Arc<str>>,
}

impl Due {
    pub(super) fn add(&mut self, queue: Option<Arc<str>>) {
        match queue {
            Some(q) => {
                self.queues.insert(q);
            }
            None => self.all = true,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        !self.all && self.queues.is_empty()
    }

    /// Whether a lease of `queue` is to be checked; takes the reason.
    pub(super) fn take(&mut self) -> impl Fn(&str) -> bool + use<> {
        let this = std::mem::take(self);
        move |q: &str| this.all || this.queues.contains(q)
    }
}

/// Reads which of `leases` are lost, in calls of at most 1000, each given `within`
/// (see [`in_chunks`]).
pub(super) async fn check(
    backend: Arc<dyn Backend>,
    leases: Vec<Lease>,
    within: Duration,
) -> Result<Vec<JobId>> {
    in_chunks(
        backend,
        leases,
        within,
        "lost_leases",
        |b, chunk| async move { b.lost_leases(&chunk).await },
    )
    .await
}

/// Calls `call` on `items` in chunks of at most 1000, each given `within` and run on a
/// task of its own (a call dropped midway could leave a connection in a transaction;
/// a backend that panics fails this round only); the jobs each call names, together.
pub(super) async fn in_chunks<T, F, Fut>(
    backend: Arc<dyn Backend>,
    items: Vec<T>,
    within: Duration,
    what: &str,
    call: F,
) -> Result<Vec<JobId>>
where
    T: Clone + Send + 'static,
    F: Fn(Arc<dyn Backend>, Vec<T>) -> Fut,
    Fut: Future<Output = Result<Vec<JobId>>> + Send + 'static,
{
    let mut named = Vec::new();
    for chunk in items.chunks(MAX_SETTLE) {
        let task = tokio::spawn(call(backend.clone(), chunk.to_vec()));
        match tokio::time::timeout(within, task).await {
            Ok(Ok(found)) => named.extend(found?),
            Ok(Err(_)) => return Err(Error::backend(format!("{what} panicked"))),
            Err(_) => return Err(Error::backend(format!("{what} timed out"))),
        }
    }
    Ok(named)
}
