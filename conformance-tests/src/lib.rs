//! # relayq-conformance
//!
//! The behaviour every relayq backend must have, as tests. Each rule of the SPEC
//! (`shared/SPEC.md`) is one or more plain `async fn(&Env) -> anyhow::Result<()>` cases
//! in [`cases`]; [`suite!`] stamps one `#[tokio::test]` per case for a backend.
//!
//! A backend crate runs the whole suite with a factory that returns an [`Env`], or
//! `None` to skip (see [`harness`] for servers):
//!
//! ```ignore
//! async fn env() -> Option<relayq_conformance::Env> {
//!     let url = relayq_conformance::harness::server_url(Server::Postgres).await?;
//!     let backend = PostgresBackend::connect(&url).await.unwrap();
//!     Some(Env::new(backend, move || { let url = url.clone(); async move { ... } }))
//! }
//! relayq_conformance::suite!(env);
//! ```
//!
//! Every case makes its own random queue names, so cases run in parallel and survive a
//! server left dirty by earlier runs.

pub mod cases;
pub mod harness;
mod util;

use std::{future::Future, sync::Arc};

use futures::future::BoxFuture;
use relayq_core::Backend;

pub use util::{poll_until, queue_name};

/// What a case gets: a backend handle, and a way to open more independent handles to
/// the same store (separate connections, as separate processes would have).
pub struct Env {
    backend: Arc<dyn Backend>,
    connect: Box<dyn Fn() -> BoxFuture<'static, anyhow::Result<Arc<dyn Backend>>> + Send + Sync>,
}

impl Env {
    /// An environment over `backend`, with `connect` opening further handles.
    pub fn new<B, F, Fut>(backend: B, connect: F) -> Self
    where
        B: Backend + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        Self {
            backend: Arc::new(backend),
            connect: Box::new(move || Box::pin(connect())),
        }
    }

    /// The main handle.
    #[must_use]
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The main handle, shared.
    #[must_use]
    pub fn shared(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// A new, independent handle to the same store.
    ///
    /// # Errors
    /// When the backend cannot connect.
    pub async fn connect(&self) -> anyhow::Result<Arc<dyn Backend>> {
        (self.connect)().await
    }
}

/// Calls `$callback! { module::case, ... }` with every case of the suite. This is the
/// one list of cases.
#[macro_export]
macro_rules! for_each_case {
    ($($callback:ident)::+ ! $( ( $($args:tt)* ) )?) => {
        $($callback)::+! { $( $($args)* ; )?
            enqueue::e1_returns_ids_in_order,
        }
    };
}

/// Stamps one `#[tokio::test]` per case, each asking `$factory().await` for an
/// [`Env`]; `None` skips the case (the harness has printed why).
#[macro_export]
macro_rules! suite {
    ($factory:path) => {
        $crate::for_each_case!($crate::__relayq_stamp!($factory));
    };
}

/// Internal: stamps the tests for [`suite!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __relayq_stamp {
    ($factory:path ; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(env) = $factory().await else { return };
                if let Err(e) = $crate::cases::$module::$case(&env).await {
                    panic!("{}::{} failed: {e:?}", stringify!($module), stringify!($case));
                }
            }
        )*
    };
}
