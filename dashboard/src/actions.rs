//! The write side of the JSON API: POST only, behind the CSRF guard, absent when the
//! dashboard is read-only.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State},
};
use relayq_core::{Batch, BatchId, JobId};
use serde_json::{Value, json};

use crate::{
    api::{id, queue},
    counts::Change,
    error::{ApiError, ApiResult},
    state::AppState,
};

/// `POST /api/queues/{queue}/pause`.
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    state.backend.pause(queue(&name)?).await?;
    state.counts.changed(&name, Change::Paused(true));
    tracing::info!(queue = %name, "relayq-dashboard: queue paused");
    Ok(Json(json!({ "paused": true })))
}

/// `POST /api/queues/{queue}/resume`.
pub(crate) async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    state.backend.resume(queue(&name)?).await?;
    state.counts.changed(&name, Change::Paused(false));
    tracing::info!(queue = %name, "relayq-dashboard: queue resumed");
    Ok(Json(json!({ "paused": false })))
}

/// `POST /api/queues/{queue}/max-running` with `{"max_running": N}` or
/// `{"max_running": null}` to lift the limit.
pub(crate) async fn max_running(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let limit = parse_max_running(&body)?;
    state.backend.set_max_running(queue(&name)?, limit).await?;
    state.counts.changed(&name, Change::MaxRunning(limit));
    tracing::info!(queue = %name, ?limit, "relayq-dashboard: max_running set");
    Ok(Json(json!({ "max_running": limit })))
}

/// The body of `max-running`, with errors that name the field.
fn parse_max_running(body: &[u8]) -> ApiResult<Option<u32>> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("expected JSON: {e}")))?;
    match value.get("max_running") {
        None => Err(ApiError::invalid("max_running", "missing")),
        Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid(
                    "max_running",
                    format!("expected null or 1..=4294967295, got {v}"),
                )
            }),
    }
}

/// `POST /api/queues/{queue}/jobs/{id}/cancel`.
pub(crate) async fn cancel_job(
    State(state): State<AppState>,
    Path((name, job)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let job = JobId(id("job", &job)?);
    let cancelled = state.backend.cancel_job(queue(&name)?, job).await?;
    state.counts.changed(&name, Change::Jobs);
    tracing::info!(queue = %name, job = job.0, cancelled, "relayq-dashboard: cancel job");
    Ok(Json(json!({ "cancelled": cancelled })))
}

/// `POST /api/queues/{queue}/batches/{id}/cancel`.
pub(crate) async fn cancel_batch(
    State(state): State<AppState>,
    Path((name, batch)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let batch = Batch {
        queue: queue(&name)?.to_owned(),
        id: BatchId(id("batch", &batch)?),
    };
    let cancelled = state.backend.cancel_batch(&batch).await?;
    state.counts.changed(&name, Change::Jobs);
    tracing::info!(queue = %name, batch = batch.id.0, cancelled, "relayq-dashboard: cancel batch");
    Ok(Json(json!({ "cancelled": cancelled })))
}

/// `POST /api/queues/{queue}/jobs/{id}/retry`: one dead job back to ready.
pub(crate) async fn retry_job(
    State(state): State<AppState>,
    Path((name, job)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let job = JobId(id("job", &job)?);
    let retried = state
        .backend
        .retry_dead(queue(&name)?, Some(&[job]))
        .await?;
    state.counts.changed(&name, Change::Jobs);
    tracing::info!(queue = %name, job = job.0, retried, "relayq-dashboard: retry dead job");
    Ok(Json(json!({ "retried": retried })))
}

/// How many dead jobs left behind by "retry all" are counted at most.
const STAYED_LIMIT: u32 = 1000;

/// `POST /api/queues/{queue}/dead/retry`: every dead job of the queue back to ready;
/// the answer also counts those that stay dead, and says why in `note`.
pub(crate) async fn retry_all(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let retried = state.backend.retry_dead(queue(&name)?, None).await?;
    state.counts.changed(&name, Change::Jobs);
    tracing::info!(queue = %name, retried, "relayq-dashboard: retry all dead jobs");
    // Say what stayed dead and why, rather than let "0 retried" look like none were.
    let left = state.backend.dead_jobs(&name, STAYED_LIMIT).await?;
    let in_batches = left.iter().filter(|j| j.batch.is_some()).count();
    let note = (!left.is_empty()).then(|| {
        format!(
            "{retried} retried; {}{} stayed dead: {in_batches} in batches (dead jobs of a batch \
             stay dead: rerun the batch), {} whose dedupe key another unfinished job holds",
            left.len(),
            if left.len() == STAYED_LIMIT as usize {
                " or more"
            } else {
                ""
            },
            left.len() - in_batches
        )
    });
    Ok(Json(json!({
        "retried": retried,
        "stayed": left.len(),
        "stayed_in_batches": in_batches,
        "note": note,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_running_body_is_checked_by_field() {
        assert_eq!(
            parse_max_running(br#"{"max_running": 3}"#).unwrap(),
            Some(3)
        );
        assert_eq!(
            parse_max_running(br#"{"max_running": null}"#).unwrap(),
            None
        );
        for bad in [
            &br#"{"max_running": 0}"#[..],
            br#"{"max_running": -1}"#,
            br#"{"max_running": "2"}"#,
            b"{}",
        ] {
            let e = parse_max_running(bad).unwrap_err();
            assert!(format!("{e:?}").contains("max_running"), "{e:?}");
        }
        assert!(format!("{:?}", parse_max_running(b"nope").unwrap_err()).contains("body"));
    }
}
