//! `/metrics`: queue gauges set from the dashboard's counts at each scrape, rendered by
//! the Prometheus recorder the application installed.
//!
//! The gauges go through the `metrics` facade, so a program with a recorder of its own
//! can call [`record_queue_gauges`] on its own schedule instead.

use axum::{
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use relayq_core::{Backend, JobState, QueueStats};

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
        set_gauges(queue, &backend.queue_stats(queue).await?);
    }
    Ok(())
}

/// How many queues `/metrics` exports at most: the configured ones, then those in use.
pub(crate) const MAX_EXPORTED: usize = crate::api::MAX_LISTED;

/// The dashboard's gauges and their help texts.
const GAUGES: &[(&str, &str)] = &[
    (
        "relayq_queues_in_use",
        "Queues that hold a job or a setting.",
    ),
    (
        "relayq_queues_not_exported",
        "Queues in use whose gauges /metrics leaves out: past its bound of 200.",
    ),
    (
        "relayq_queue_counted_seconds_ago",
        "How old the counts behind the queue's gauges are (big queues are counted at most every 30 s).",
    ),
    ("relayq_queue_jobs", "Jobs of the queue in each state."),
    ("relayq_queue_running", "Jobs of the queue running now."),
    (
        "relayq_queue_max_running",
        "The queue's limit of running jobs; 0 when it has none.",
    ),
    ("relayq_queue_paused", "1 when the queue is paused, else 0."),
    (
        "relayq_queue_oldest_ready_seconds",
        "How long the queue's longest-waiting claimable job has waited.",
    ),
];

/// Upper bounds of `relayq_worker_handler_seconds`' buckets: 5 ms to an hour.
pub const HANDLER_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// A Prometheus exporter set up for relayq's series: the handler time as a histogram
/// (buckets add up across workers and processes; a summary's quantiles do not, and
/// read 0 when idle). Install it, then call [`describe`].
#[must_use]
pub fn prometheus() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("relayq_worker_handler_seconds".to_owned()),
            HANDLER_BUCKETS,
        )
        // Refused only for an empty list of buckets.
        .unwrap_or_else(|_| PrometheusBuilder::new())
}

/// Gives the installed recorder the help text (`# HELP` line) of every relayq series:
/// the worker's and the dashboard's.
pub fn describe() {
    relayq_core::worker::describe_metrics();
    for &(name, help) in GAUGES {
        metrics::describe_gauge!(name, help);
    }
}

/// The gauges of one queue.
fn set_gauges(queue: &str, stats: &QueueStats) {
    for state in JobState::ALL {
        metrics::gauge!("relayq_queue_jobs", "queue" => queue.to_owned(), "state" => state.as_str())
            .set(count(stats.count(state)));
    }
    metrics::gauge!("relayq_queue_running", "queue" => queue.to_owned())
        .set(count(stats.count(JobState::Running)));
    metrics::gauge!("relayq_queue_max_running", "queue" => queue.to_owned())
        .set(stats.max_running.map_or(0.0, f64::from));
    metrics::gauge!("relayq_queue_paused", "queue" => queue.to_owned()).set(if stats.paused {
        1.0
    } else {
        0.0
    });
    let waited = stats
        .oldest_ready_age(chrono::Utc::now())
        .unwrap_or_default();
    metrics::gauge!("relayq_queue_oldest_ready_seconds", "queue" => queue.to_owned())
        .set(waited.as_secs_f64());
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
    // The dashboard's counts (see counts/mod.rs): a big queue's gauges are its last count,
    // up to 30 s (and one count's time) old, and a queue whose first count is still
    // running has none yet.
    //
    // Every queue in use, not only the configured ones (a paused queue elsewhere would
    // be invisible), up to the queue list's bound: each costs a count. How many were
    // left out is a gauge of its own, so a truncated export is visible.
    let Ok(in_use) = state.backend.queues().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "cannot list the queues\n").into_response();
    };
    let mut queues = state.options.queues.clone();
    let mut left_out = 0_u64;
    for name in &in_use {
        if queues.contains(name) {
            continue;
        }
        if queues.len() < MAX_EXPORTED {
            queues.push(name.clone());
        } else {
            left_out += 1;
        }
    }
    metrics::gauge!("relayq_queues_in_use").set(count(in_use.len() as u64));
    metrics::gauge!("relayq_queues_not_exported").set(count(left_out));
    let now = chrono::Utc::now();
    for (queue, answer) in queues.iter().zip(state.counts.get_many(&queues).await) {
        match answer {
            Ok(Some(counted)) => {
                set_gauges(queue, &counted.stats);
                let age = (now - counted.at).to_std().unwrap_or_default();
                metrics::gauge!("relayq_queue_counted_seconds_ago", "queue" => queue.clone())
                    .set(age.as_secs_f64());
            }
            Ok(None) => {}
            Err(_) => {
                // Stale gauges would look current: fail the scrape so Prometheus marks
                // it down. (The error itself was logged where it happened.)
                return (StatusCode::SERVICE_UNAVAILABLE, "cannot read the queues\n")
                    .into_response();
            }
        }
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
