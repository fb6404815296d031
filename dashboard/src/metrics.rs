//! `/metrics`: the queue gauges, written from the dashboard's counts at each scrape,
//! then everything the Prometheus recorder the application installed holds (the
//! workers' series).
//!
//! A program that serves its own metrics instead can set the same gauges through the
//! `metrics` facade with [`record_queue_gauges`], on its own schedule (not together
//! with the dashboard's `/metrics`, which would then show each family twice).

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
    let now = chrono::Utc::now();
    let mut rows = Vec::with_capacity(queues.len());
    for (queue, answer) in queues.iter().zip(state.counts.get_many(&queues).await) {
        match answer {
            Ok(Some(counted)) => {
                let age = (now - counted.at).to_std().unwrap_or_default();
                rows.push((queue.as_str(), counted.stats, age.as_secs_f64()));
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
    let mut text = queue_text(&rows, in_use.len(), left_out);
    text.push_str(&handle.render());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The queue gauges as Prometheus text, written fresh at each scrape rather than kept
/// in the recorder, which holds a gauge's last value forever: a queue that leaves the
/// export (pruned, or past the bound) must leave no series behind that looks current.
fn queue_text(rows: &[(&str, QueueStats, f64)], in_use: usize, left_out: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut family = |name: &str, samples: &mut dyn Iterator<Item = (String, f64)>| {
        let help = GAUGES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, h)| *h);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let q = |queue: &str| label("queue", queue);
    family(
        "relayq_queues_in_use",
        &mut std::iter::once((String::new(), count(in_use as u64))),
    );
    family(
        "relayq_queues_not_exported",
        &mut std::iter::once((String::new(), count(left_out))),
    );
    family(
        "relayq_queue_jobs",
        &mut rows.iter().flat_map(|(queue, stats, _)| {
            JobState::ALL.into_iter().map(move |state| {
                let labels = format!("{{{},{}}}", q(queue), label("state", state.as_str()));
                (labels, count(stats.count(state)))
            })
        }),
    );
    let per_queue = |f: fn(&QueueStats, f64) -> f64| {
        rows.iter()
            .map(move |(queue, stats, age)| (format!("{{{}}}", q(queue)), f(stats, *age)))
    };
    family(
        "relayq_queue_running",
        &mut per_queue(|s, _| count(s.count(JobState::Running))),
    );
    family(
        "relayq_queue_max_running",
        &mut per_queue(|s, _| s.max_running.map_or(0.0, f64::from)),
    );
    family(
        "relayq_queue_paused",
        &mut per_queue(|s, _| if s.paused { 1.0 } else { 0.0 }),
    );
    family(
        "relayq_queue_oldest_ready_seconds",
        &mut per_queue(|s, _| {
            s.oldest_ready_age(chrono::Utc::now())
                .unwrap_or_default()
                .as_secs_f64()
        }),
    );
    family(
        "relayq_queue_counted_seconds_ago",
        &mut per_queue(|_, age| age),
    );
    out
}

/// `name="value"`, the value escaped as the text format asks.
fn label(name: &str, value: &str) -> String {
    let value = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("{name}=\"{value}\"")
}
