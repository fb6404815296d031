//! `/metrics`: queue gauges refreshed at each scrape, rendered by the Prometheus
//! recorder the application installed.
//!
//! The gauges go through the `metrics` facade, so a program with a recorder of its own
//! can call [`record_queue_gauges`] on its own schedule instead.

use axum::{
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use relayq_core::{Backend, JobState};

use crate::state::AppState;

/// Sets, for each of `queues`: `relayq_queue_jobs{queue,state}` (every state, zero
/// included, so a drained state drops to 0 instead of keeping its last value),
/// `relayq_queue_running{queue}`, `relayq_queue_max_running{queue}` (0 without a
/// limit: a limit of 0 is not allowed, so 0 cannot mean anything else),
/// `relayq_queue_paused{queue}` (1 or 0) and `relayq_queue_oldest_ready_seconds{queue}`
/// (how long the longest-waiting claimable job has waited; 0 when none waits).
///
/// # Errors
/// The backend's error for the first queue it could not read; gauges of the queues
/// before it are set.
pub async fn record_queue_gauges(
    backend: &dyn Backend,
    queues: &[String],
) -> relayq_core::Result<()> {
    for queue in queues {
        let stats = backend.queue_stats(queue).await?;
        for state in JobState::ALL {
            metrics::gauge!("relayq_queue_jobs", "queue" => queue.clone(), "state" => state.as_str())
                .set(count(stats.count(state)));
        }
        metrics::gauge!("relayq_queue_running", "queue" => queue.clone())
            .set(count(stats.count(JobState::Running)));
        metrics::gauge!("relayq_queue_max_running", "queue" => queue.clone())
            .set(stats.max_running.map_or(0.0, f64::from));
        metrics::gauge!("relayq_queue_paused", "queue" => queue.clone()).set(if stats.paused {
            1.0
        } else {
            0.0
        });
        let waited = stats
            .oldest_ready_age(chrono::Utc::now())
            .unwrap_or_default();
        metrics::gauge!("relayq_queue_oldest_ready_seconds", "queue" => queue.clone())
            .set(waited.as_secs_f64());
    }
    Ok(())
}

/// A job count as a gauge value: exact up to 2^53, far beyond any queue.
#[allow(clippy::cast_precision_loss)]
fn count(n: u64) -> f64 {
    n as f64
}

/// `GET /metrics`: 404 unless [`Options::metrics`](crate::Options::metrics) is set.
pub(crate) async fn serve(State(state): State<AppState>) -> Response {
    let Some(handle) = state.options.metrics.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if let Err(e) = record_queue_gauges(state.backend.as_ref(), &state.options.queues).await {
        // Stale gauges would look current: fail the scrape so Prometheus marks it down.
        tracing::warn!(error = %e, "relayq-dashboard: /metrics could not read the queues");
        return (StatusCode::SERVICE_UNAVAILABLE, "cannot read the queues\n").into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}
