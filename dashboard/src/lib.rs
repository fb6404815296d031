//! # relayq-dashboard
//!
//! A web dashboard for relayq as an [`axum::Router`] over any `Arc<dyn Backend>`: pages
//! for queues, batches with their stages, any job found by filter (with bulk cancel,
//! retry and delete), running jobs, dead jobs and each job's attempts, the JSON API under `/api/` that those pages poll, and Prometheus text at
//! `/metrics`. Mount it in your own service, or run it with `relayq dashboard`.
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn relayq_core::Backend>) -> std::io::Result<()> {
//! use relayq_dashboard::{Options, router};
//!
//! let options = Options {
//!     queues: vec!["default".into(), "mail".into()],
//!     token: Some("a long random secret".into()),
//!     ..Options::default()
//! };
//! let app = axum::Router::new().nest("/relayq", router(backend, options));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! Security (see the crate README): actions are POST only and need the page's CSRF
//! token in a header plus a same-origin request; [`Options::read_only`] removes every
//! action route; [`Options::token`] makes every request carry the token. Stored text
//! (payloads, errors, output, names) reaches the browser only as JSON data that the
//! page sets with `textContent`.

mod actions;
mod api;
mod counts;
mod error;
mod jobs;
mod metrics;
mod pages;
mod routes;
mod schedules;
mod security;
mod state;
mod views;
mod workers;

use std::sync::Arc;

use relayq_core::Backend;

pub use metrics::{HANDLER_BUCKETS, describe as describe_metrics, prometheus, record_queue_gauges};
pub use metrics_exporter_prometheus::PrometheusHandle;

/// How the dashboard behaves.
#[derive(Clone, Default)]
pub struct Options {
    /// Queues the queue list shows first, even before they hold a job. After them it
    /// shows every queue in use (the backend's `queues()`, at most 200), then any named
    /// in the URL (`/?queues=a,b`, or a queue's own pages).
    pub queues: Vec<String>,
    /// No action routes at all (they answer 404) and no buttons.
    pub read_only: bool,
    /// When set, every request must carry it: `Authorization: Bearer <token>`, or a
    /// visit to any page with `?token=<token>`, which sets an HttpOnly session cookie.
    pub token: Option<String>,
    /// Without a token, the dashboard answers only requests addressed (by their `Host`
    /// header) to a loopback name (`localhost`, `127.0.0.1`, `[::1]`) or to one of these
    /// (`dash.internal` or `dash.internal:8080`): a page of another site that rebinds
    /// its own name to 127.0.0.1 would otherwise be same-origin with the dashboard.
    /// With a token, any host is answered.
    pub allowed_hosts: Vec<String>,
    /// Serves `/metrics` from this Prometheus recorder's handle, after refreshing the
    /// queue gauges; without it `/metrics` answers 404. Install the recorder yourself
    /// (`PrometheusBuilder::install_recorder`), so the worker's metrics land there too.
    pub metrics: Option<PrometheusHandle>,
}

impl Options {
    /// Checks the options: every name in [`queues`](Self::queues) is a valid queue name,
    /// and a [`token`](Self::token) is not empty.
    ///
    /// # Errors
    /// [`relayq_core::Error::InvalidInput`] on field `queue` or `token`.
    pub fn validate(&self) -> relayq_core::Result<()> {
        for queue in &self.queues {
            relayq_core::validate::queue_name(queue)?;
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return Err(relayq_core::Error::invalid("token", "must not be empty"));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Options {
    // By hand, so that the token never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("queues", &self.queues)
            .field("read_only", &self.read_only)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

/// The dashboard: pages, the JSON API and `/metrics`, over `backend`.
///
/// Each call makes a fresh CSRF token and session secret, so two routers (or a
/// restarted process) never accept each other's.
///
/// # Panics
/// When [`Options::validate`] fails: a bad queue name or an empty token is a mistake
/// in the embedding program, caught at start-up rather than on the first request.
pub fn router(backend: Arc<dyn Backend>, options: Options) -> axum::Router {
    if let Err(e) = options.validate() {
        panic!("relayq-dashboard Options: {e}");
    }
    routes::build(state::AppState::new(backend, options))
}
