//! The dashboard's answers on a big queue (the goal: every page and API call within
//! 100 ms on a queue of 1,000,000 jobs on PostgreSQL): each route of
//! `relayq-dashboard`'s router, called in process over the backlog scenario's largest
//! backlog, five times, one right after the other; the median is reported, and the
//! slowest call in the note. The very first call, which finds nothing counted, is a
//! row of its own. The HTTP stack
//! costs microseconds; what is measured is the backend's reads behind each answer.
//!
//! The dashboard answers a big queue's counts from its last count, taken in the
//! background (`dashboard/src/counts`): the row "queue_stats" times that count itself,
//! so what it costs the server, and how old the counts get, stay in view.

use std::{sync::Arc, time::Instant};

use axum::{body::Body, http::Request};
use relayq::{Backend, ClaimRequest, CompleteExt};
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
    // A batch of 200 in the same queue, for the batch page, ahead of the backlog
    // (priority -1) so that its jobs are claimed first. Stage 0's 50 fail once and
    // then succeed; stage 1's 50 are left running. So the timeline's first page of 100
    // reads 150 attempts, from both tables.
    let batch = b.open_batch(q, relayq::OnFailure::Continue).await?;
    b.enqueue(
        (0..200)
            .map(|i| {
                relayq::NewJob::new(q, b"b".to_vec())
                    .priority(-1)
                    .in_batch(batch.id, i / 50)
            })
            .collect(),
    )
    .await?;
    let claim = || {
        b.claim(ClaimRequest::new(
            q,
            "bench-dashboard-batch",
            50,
            std::time::Duration::from_secs(300),
        ))
    };
    for job in claim().await? {
        b.fail(
            &job.lease,
            "once",
            relayq::Retry::After(std::time::Duration::ZERO),
        )
        .await?;
    }
    for job in claim().await? {
        b.complete(&job.lease).await?;
    }
    let running = claim().await?;
    anyhow::ensure!(
        running.len() == 50,
        "stage 1 not released: {}",
        running.len()
    );
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
            format!("/api/queues/{q}/batches/{}/jobs?limit=100", batch.id.0),
            "GET /api/queues/{q}/batches/{id}/jobs (100, the timeline)",
        ),
        (
            format!("/api/queues/{q}/jobs?limit=50"),
            "GET /api/queues/{q}/jobs (a page of 50, newest first)",
        ),
        (
            format!("/api/queues/{q}/jobs?limit=50&state=ready&before={}", n / 2),
            "GET /api/queues/{q}/jobs (ready, a page from the middle)",
        ),
        (
            format!("/api/queues/{q}/jobs?limit=50&text=no-such-text"),
            "GET /api/queues/{q}/jobs (a text no job holds: one bounded scan)",
        ),
        ("/metrics".to_owned(), "GET /metrics"),
        ("/".to_owned(), "GET / (the page)"),
    ];
    // The first call finds nothing counted: it waits up to the dashboard's limit for
    // the count it starts, then answers "counting". Timed alone, then the count is
    // let finish, so the rows below show what every later call costs.
    let start = Instant::now();
    let first = get(&app, "/api/queues").await?;
    rows.push(row(
        format!("dashboard GET /api/queues, first call (nothing counted yet), {n} pending"),
        target,
        start.elapsed().as_secs_f64() * 1000.0,
        format!("answered counted={}", first.contains("\"counted\":true")),
    ));
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !get(&app, &format!("/api/queues/{q}"))
        .await?
        .contains("\"counted\":true")
    {
        anyhow::ensure!(Instant::now() < deadline, "{q} was never counted");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for (uri, name) in routes {
        let mut took = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let start = Instant::now();
            get(&app, &uri).await?;
            took.push(start.elapsed().as_secs_f64() * 1000.0);
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

/// GETs `uri`; its body, or an error for any status but 200.
async fn get(app: &axum::Router, uri: &str) -> anyhow::Result<String> {
    let answer = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty())?)
        .await?;
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), usize::MAX).await?;
    anyhow::ensure!(status.is_success(), "{uri} answered {status}");
    Ok(String::from_utf8_lossy(&body).into_owned())
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
