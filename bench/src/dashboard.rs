//! The dashboard's answers on a big queue (issue 45: every page and API call within
//! 100 ms on a queue of 1,000,000 jobs on PostgreSQL): each route of
//! `relayq-dashboard`'s router, called in process over the backlog scenario's largest
//! backlog, five times; the median is reported. The HTTP stack costs microseconds; what
//! is measured is the backend's reads behind each answer.

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
        ("/metrics".to_owned(), "GET /metrics"),
        ("/".to_owned(), "GET / (the page)"),
    ];
    let mut rows = Vec::new();
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
        let row = Row {
            scenario: format!("dashboard {name}, {n} pending"),
            target: target.to_owned(),
            value: median(took),
            unit: "ms",
            note: String::new(),
        };
        crate::print(std::slice::from_ref(&row));
        rows.push(row);
    }
    Ok(rows)
}
