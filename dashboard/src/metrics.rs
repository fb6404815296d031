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

/// One sample of a queue gauge: its name, its labels, its value.
type Sample = (&'static str, Vec<(&'static str, String)>, f64);

/// Every gauge of one queue, the one list behind both [`record_queue_gauges`] and
/// `/metrics`' text.
fn queue_samples(queue: &str, stats: &QueueStats) -> Vec<Sample> {
    let q = || vec![("queue", queue.to_owned())];
    let mut out: Vec<Sample> = JobState::ALL
        .into_iter()
        .map(|state| {
            let labels = vec![
                ("queue", queue.to_owned()),
                ("state", state.as_str().to_owned()),
            ];
            ("relayq_queue_jobs", labels, count(stats.count(state)))
        })
        .collect();
    let waited = stats
        .oldest_ready_age(chrono::Utc::now())
        .unwrap_or_default();
    out.extend([
        (
            "relayq_queue_running",
            q(),
            count(stats.count(JobState::Running)),
        ),
        (
            "relayq_queue_max_running",
            q(),
            stats.max_running.map_or(0.0, f64::from),
        ),
        (
            "relayq_queue_paused",
            q(),
            if stats.paused { 1.0 } else { 0.0 },
        ),
        (
            "relayq_queue_oldest_ready_seconds",
            q(),
            waited.as_secs_f64(),
        ),
    ]);
    out
}

/// The gauges of one queue, through the `metrics` facade.
fn set_gauges(queue: &str, stats: &QueueStats) {
    for (name, labels, value) in queue_samples(queue, stats) {
        let labels: Vec<metrics::Label> = labels
            .into_iter()
            .map(|(k, v)| metrics::Label::new(k, v))
            .collect();
        metrics::gauge!(name, labels).set(value);
    }
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
    let mut samples: Vec<Sample> = vec![
        ("relayq_queues_in_use", Vec::new(), count(in_use as u64)),
        ("relayq_queues_not_exported", Vec::new(), count(left_out)),
    ];
    for (queue, stats, age) in rows {
        samples.extend(queue_samples(queue, stats));
        let labels = vec![("queue", (*queue).to_owned())];
        samples.push(("relayq_queue_counted_seconds_ago", labels, *age));
    }
    // One family at a time, each with its help text once.
    let mut out = String::new();
    for &(name, help) in GAUGES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (_, labels, value) in samples.iter().filter(|(n, ..)| *n == name) {
            let labels: Vec<String> = labels.iter().map(|(k, v)| label(k, v)).collect();
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.join(","))
            };
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }
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

#[cfg(test)]
mod tests {
    use relayq_core::{Admin, EnqueueExt, NewJob, memory::MemoryBackend};

    use super::*;

    /// `record_queue_gauges` sets, through the facade, the same samples `/metrics`
    /// writes (one list behind both).
    #[test]
    fn recorded_gauges_are_the_exported_ones() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let backend = MemoryBackend::new();
                backend
                    .enqueue_one(NewJob::new("m", b"x".to_vec()))
                    .await
                    .unwrap();
                backend.pause("m").await.unwrap();
                record_queue_gauges(&backend, &["m".to_owned()])
                    .await
                    .unwrap();
            });
        let text = handle.render();
        for line in [
            r#"relayq_queue_jobs{queue="m",state="ready"} 1"#,
            r#"relayq_queue_jobs{queue="m",state="dead"} 0"#,
            r#"relayq_queue_paused{queue="m"} 1"#,
            r#"relayq_queue_max_running{queue="m"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
