//! The dashboard's answers on a big queue (issue 45: every page and API call within
//! 100 ms on a queue of 1,000,000 jobs on PostgreSQL): each route of
//! `relayq-dashboard`'s router, called in process over the backlog scenario's largest
//! backlog, five times, one right after the other; the median is reported, and the
//! slowest call in the note (the first, which finds no count cached). The HTTP stack
//! costs microseconds; what is measured is the backend's reads behind each answer.
//!
//! The dashboard answers a big queue's counts from its last count, taken in the
//! background (`dashboard/src/counts`): the row "queue_stats" times that count itself,
//! so what it costs the server, and how old the counts get, stay in view.

use std::{sync::Arc, time::Instant};

use axum::{body::Body, http::Request};
use relayq::{Backend, ClaimRequest};
use tower::ServiceExt;

use crate::{Row, median};

const CALLS: usize = 5;

/// Times each API route against `q`, which holds `n` ready jobs; five of them are
/// claimed first, so the running list has rows.
pub async fn time_api(
    b: Arc<dyn Backend>,
    q: &str,
    n: usize,
    target: &str,
) -> anyhow::Result<Vec<Row>> {
    let held = b
        .claim(ClaimRequest::new(
            q,
            "bench-dashboard",
            5,
            std::time::Duration::from_secs(300),
        ))
        .await?;
    let id = held.first().map_or(1, |j| j.lease.job.0);
    // A batch of 200 in the same queue, for the batch page (the timeline reads each job).
    let batch = b.open_batch(q, relayq::OnFailure::Continue).await?;
    b.enqueue(
        (0..200)
            .map(|i| relayq::NewJob::new(q, b"b".to_vec()).in_batch(batch.id, i / 50))
            .collect(),
    )
    .await?;
    let mut rows = Vec::new();
    let start = Instant::now();
    b.queue_stats(q).await?;
    rows.push(row(
        format!("dashboard's background count (queue_stats), {n} pending"),
        target,
        start.elapsed().as_secs_f64() * 1000.0,
        "counts older than this are refreshed; answers never wait for it".to_owned(),
    ));
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let app = relayq_dashboard::router(
        b,
        relayq_dashboard::Options {
            queues: vec![q.to_owned()],
            metrics: Some(metrics),
            ..relayq_dashboard::Options::default()
        },
    );
    let routes = [
        ("/api/queues".to_owned(), "GET /api/queues"),
        (format!("/api/queues/{q}"), "GET /api/queues/{q}"),
        (
            format!("/api/queues/{q}/batches?limit=50"),
            "GET /api/queues/{q}/batches",
        ),
        (
            format!("/api/queues/{q}/running?limit=50"),
            "GET /api/queues/{q}/running",
        ),
        (
            format!("/api/queues/{q}/dead?limit=50"),
            "GET /api/queues/{q}/dead",
        ),
        (
            format!("/api/queues/{q}/jobs/{id}"),
            "GET /api/queues/{q}/jobs/{id}",
        ),
        (
            format!("/api/queues/{q}/batches/{}", batch.id.0),
            "GET /api/queues/{q}/batches/{id}",
        ),
        (
            format!("/api/queues/{q}/batches/{}/jobs?limit=200", batch.id.0),
            "GET /api/queues/{q}/batches/{id}/jobs (200, the timeline)",
        ),
        ("/metrics".to_owned(), "GET /metrics"),
        ("/".to_owned(), "GET / (the page)"),
    ];
    for (uri, name) in routes {
        let mut took = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let start = Instant::now();
            let answer = app
                .clone()
                .oneshot(Request::get(&uri).body(Body::empty())?)
                .await?;
            let status = answer.status();
            axum::body::to_bytes(answer.into_body(), usize::MAX).await?;
            took.push(start.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(status.is_success(), "{uri} answered {status}");
        }
        let slowest = took.iter().copied().fold(0.0, f64::max);
        rows.push(row(
            format!("dashboard {name}, {n} pending"),
            target,
            median(took),
            format!("slowest of {CALLS}: {slowest:.2} ms"),
        ));
    }
    Ok(rows)
}

fn row(scenario: String, target: &str, value: f64, note: String) -> Row {
    let row = Row {
        scenario,
        target: target.to_owned(),
        value,
        unit: "ms",
        note,
    };
    crate::print(std::slice::from_ref(&row));
    row
}
