//! Shared by the dashboard's tests: a SQLite backend in a temp folder, a random queue,
//! dead jobs with hostile text, and one-shot requests against the router.
#![allow(dead_code, missing_docs)]

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    http::{HeaderMap, Method, Request, StatusCode},
};
use relayq_core::{
    Backend, Batch, ClaimRequest, CompleteExt, EnqueueExt, JobId, NewJob, OnFailure, Retry, Settle,
};
use relayq_sqlite::SqliteBackend;
use tower::ServiceExt;

pub const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>";

pub struct Db {
    pub backend: Arc<dyn Backend>,
    _dir: Option<tempfile::TempDir>,
}

pub async fn sqlite() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("dash.db").display());
    let backend = SqliteBackend::open(&url).await.unwrap();
    Db {
        backend: Arc::new(backend),
        _dir: Some(dir),
    }
}

/// The server at `url`, through the facade (migrated); tests use random queue names.
pub async fn server(url: &str) -> Db {
    Db {
        backend: relayq::connect(url).await.unwrap(),
        _dir: None,
    }
}

pub fn queue() -> String {
    format!("dash-{}", uuid::Uuid::new_v4().simple())
}

/// A sealed `Continue` batch of one job on `queue`, claimed and failed for good: a
/// batch that finished with a dead job.
pub async fn dead_batch_job(backend: &dyn Backend, queue: &str) -> (Batch, JobId) {
    let batch = backend
        .open_batch(queue, OnFailure::Continue)
        .await
        .unwrap();
    let id = backend
        .enqueue_one(NewJob::new(queue, b"b".to_vec()).in_batch(batch.id, 1))
        .await
        .unwrap()
        .id;
    backend.seal(&batch).await.unwrap();
    fail_next(backend, queue, "boom").await;
    (batch, id)
}

/// Enqueues one job with `payload`, claims it as `worker` and fails it for good with
/// `error` and `output`: a dead job.
pub async fn dead_job(backend: &dyn Backend, queue: &str, payload: &str, error: &str) -> JobId {
    let id = backend
        .enqueue_one(NewJob::new(queue, payload.as_bytes().to_vec()))
        .await
        .unwrap()
        .id;
    fail_next(backend, queue, error).await;
    id
}

/// Claims the next job of `queue` as `w<1>` and fails it for good with `error` and
/// `output: <error>`.
async fn fail_next(backend: &dyn Backend, queue: &str, error: &str) {
    let claimed = backend
        .claim(ClaimRequest::new(queue, "w<1>", 1, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    backend
        .settle_one(
            Settle::fail(claimed[0].lease.clone(), error, Retry::Never)
                .with_output(Some(format!("output: {error}"))),
        )
        .await
        .unwrap();
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

pub async fn get(app: &Router, uri: &str) -> Answer {
    send(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// GETs `uri` until `done` accepts the answer, for up to 10 s: on a loaded machine a
/// queue's first count may outlast the 50 ms the dashboard waits for it.
pub async fn get_until(app: &Router, uri: &str, done: impl Fn(&Answer) -> bool) -> Answer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = get(app, uri).await;
        if done(&answer) || std::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether every queue of an answer has been counted.
pub fn counted(answer: &Answer) -> bool {
    answer.status == 200 && !answer.body.contains(r#""counted":false"#)
}

/// A POST as the dashboard's own page sends it: same origin, with the CSRF token.
pub async fn post(app: &Router, uri: &str, csrf: &str, body: &str) -> Answer {
    send(
        app,
        Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("host", "127.0.0.1:8080")
            .header("origin", "http://127.0.0.1:8080")
            .header("sec-fetch-site", "same-origin")
            .header("x-relayq-csrf", csrf)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap(),
    )
    .await
}

/// The CSRF token a page embeds.
pub fn csrf_of(page: &str) -> String {
    let marker = r#"<meta name="relayq-csrf" content=""#;
    let start = page.find(marker).expect("a CSRF meta tag") + marker.len();
    let end = start + page[start..].find('"').unwrap();
    page[start..end].to_owned()
}

pub fn meta_of(page: &str, name: &str) -> String {
    let marker = format!(r#"<meta name="relayq-{name}" content=""#);
    let start = page.find(&marker).expect("the meta tag") + marker.len();
    let end = start + page[start..].find('"').unwrap();
    page[start..end].to_owned()
}
