//! The route table: pages, the read API and `/metrics` always; the actions unless the
//! dashboard is read-only. The host and token guards wrap everything.

use axum::{
    Router,
    http::{HeaderValue, header},
    middleware::{from_fn_with_state, map_response},
    response::Response,
    routing::{get, post},
};

use crate::{actions, api, jobs, metrics, pages, schedules, security, state::AppState, workers};

pub(crate) fn build(state: AppState) -> Router {
    let read = Router::new()
        .route("/", get(pages::queues))
        .route("/workers", get(pages::workers))
        .route("/queues/{queue}", get(pages::queue_home))
        .route("/queues/{queue}/{list}", get(pages::queue_page))
        .route("/queues/{queue}/{kind}/{id}", get(pages::item_page))
        .route("/assets/app.js", get(pages::app_js))
        .route("/assets/style.css", get(pages::style_css))
        .route("/api/queues", get(api::queues))
        .route("/api/workers", get(workers::all))
        .route("/api/queues/{queue}/workers", get(workers::of_queue))
        .route("/api/queues/{queue}", get(api::queue_stats))
        .route("/api/queues/{queue}/history", get(api::history))
        .route("/api/queues/{queue}/batches", get(api::batches))
        .route("/api/queues/{queue}/batches/{id}", get(api::batch))
        .route(
            "/api/queues/{queue}/batches/{id}/jobs",
            get(api::batch_jobs),
        )
        .route("/api/queues/{queue}/running", get(api::running))
        .route("/api/queues/{queue}/keys", get(api::keys))
        .route("/api/queues/{queue}/dead", get(api::dead))
        .route("/api/queues/{queue}/schedules", get(schedules::list))
        .route("/api/queues/{queue}/jobs", get(jobs::list))
        .route("/api/queues/{queue}/jobs/{id}", get(api::job))
        .route("/api/queues/{queue}/jobs/{id}/why", get(api::why))
        .route("/metrics", get(metrics::serve));
    let app = if state.options.read_only {
        // Not hidden, absent: a read-only dashboard has no route that changes anything.
        read
    } else {
        let actions = Router::new()
            .route("/api/queues/{queue}/pause", post(actions::pause))
            .route("/api/queues/{queue}/resume", post(actions::resume))
            .route(
                "/api/queues/{queue}/max-running",
                post(actions::max_running),
            )
            .route(
                "/api/queues/{queue}/jobs/{id}/cancel",
                post(actions::cancel_job),
            )
            .route(
                "/api/queues/{queue}/jobs/{id}/retry",
                post(actions::retry_job),
            )
            .route(
                "/api/queues/{queue}/batches/{id}/cancel",
                post(actions::cancel_batch),
            )
            .route("/api/queues/{queue}/dead/retry", post(actions::retry_all))
            .route("/api/queues/{queue}/jobs/bulk", post(jobs::bulk))
            .route(
                "/api/queues/{queue}/schedules/{name}/pause",
                post(schedules::pause),
            )
            .route(
                "/api/queues/{queue}/schedules/{name}/resume",
                post(schedules::resume),
            )
            .route(
                "/api/queues/{queue}/schedules/{name}/run-now",
                post(schedules::run_now),
            )
            .route_layer(from_fn_with_state(
                state.clone(),
                security::require_same_origin,
            ));
        read.merge(actions)
    };
    // Layers run outside in: the host check, then the token, then the route.
    app.layer(from_fn_with_state(state.clone(), security::require_token))
        .layer(from_fn_with_state(
            state.clone(),
            security::require_known_host,
        ))
        .layer(map_response(hardening_headers))
        .with_state(state)
}

/// Headers on every answer. The CSP allows scripts and styles from this dashboard only,
/// with no inline script: even text that slipped into the page as markup would not
/// run.
async fn hardening_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
