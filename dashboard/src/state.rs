//! What every handler shares: the backend, the options and this router's secrets.

use std::sync::Arc;

use relayq_core::Backend;

use crate::{Options, counts::Counts};

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) options: Options,
    /// Queue counts, cached where counting is slow.
    pub(crate) counts: Counts,
    /// Embedded in every page and required on every POST (CSRF).
    pub(crate) csrf: String,
    /// The value of the session cookie a `?token=` login sets: random per router, so
    /// the cookie never holds the token itself.
    pub(crate) session: String,
}

impl AppState {
    /// The state, and (inside a Tokio runtime) the task that samples every queue's
    /// counts for the charts until the state is dropped.
    pub(crate) fn new(backend: Arc<dyn Backend>, options: Options) -> Self {
        let inner = Arc::new(Inner {
            counts: Counts::new(Arc::clone(&backend)),
            backend,
            options,
            csrf: random_secret(),
            session: random_secret(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(crate::counts::sampler::run(Arc::downgrade(&inner)));
        }
        Self(inner)
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// 244 random bits (two v4 UUIDs, from a CSPRNG the OS seeds), as hex.
fn random_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
