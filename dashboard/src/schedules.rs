//! Schedules (SPEC S5): the list, and pause, resume and run-now as actions.

use axum::{
    Json,
    extract::{Path, State},
};
use relayq_core::{
    redact,
    schedule::{Fired, ScheduleInfo},
    validate::schedule_name,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    api::queue,
    error::{ApiError, ApiResult},
    state::AppState,
};

/// A schedule as the page shows it: its jobs' payloads masked like a job's.
#[derive(Debug, Serialize)]
pub(crate) struct ScheduleView {
    name: String,
    cron: Option<String>,
    time_zone: Option<String>,
    paused: bool,
    /// `latest`, `skip`, or `all within N s`.
    missed: Option<String>,
    /// What each slot enqueues: a command line per job, or the batch's job count.
    makes: Option<String>,
    last_slot: Option<chrono::DateTime<chrono::Utc>>,
    last_job: Option<i64>,
    last_batch: Option<i64>,
    next_slot: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<ScheduleInfo> for ScheduleView {
    fn from(s: ScheduleInfo) -> Self {
        let d = s.definition.as_ref();
        let makes = d.map(|d| match (d.batch, d.jobs.as_slice()) {
            (None, [one]) => redact::payload(&one.payload),
            (None, jobs) => format!("{} jobs", jobs.len()),
            (Some(_), jobs) => format!("a batch of {} jobs", jobs.len()),
        });
        let missed = d.map(|d| match d.missed {
            relayq_core::schedule::Missed::Latest => "latest".to_owned(),
            relayq_core::schedule::Missed::Skip => "skip".to_owned(),
            relayq_core::schedule::Missed::All { within_secs } => {
                format!("all within {within_secs} s")
            }
        });
        Self {
            cron: d.map(|d| d.cron.clone()),
            time_zone: d.map(|d| d.time_zone.clone()),
            missed,
            makes,
            name: s.name,
            paused: s.paused,
            last_slot: s.last_slot,
            last_job: s.last_job.map(|j| j.0),
            last_batch: s.last_batch.map(|b| b.0),
            next_slot: s.next_slot,
        }
    }
}

/// `GET /api/queues/{queue}/schedules`: by name.
pub(crate) async fn list(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<ScheduleView>>> {
    let all = state.backend.schedules(queue(&name)?).await?;
    Ok(Json(all.into_iter().map(ScheduleView::from).collect()))
}

fn name_of(text: &str) -> ApiResult<&str> {
    schedule_name(text).map_err(|e| ApiError::invalid("schedule", e.to_string()))?;
    Ok(text)
}

/// `POST /api/queues/{queue}/schedules/{name}/pause`.
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path((q, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    set_paused(&state, &q, &name, true).await
}

/// `POST /api/queues/{queue}/schedules/{name}/resume`.
pub(crate) async fn resume(
    State(state): State<AppState>,
    Path((q, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    set_paused(&state, &q, &name, false).await
}

async fn set_paused(state: &AppState, q: &str, name: &str, paused: bool) -> ApiResult<Json<Value>> {
    state
        .backend
        .pause_schedule(queue(q)?, name_of(name)?, paused)
        .await?;
    tracing::info!(queue = %q, schedule = %name, paused, "relayq-dashboard: schedule paused or resumed");
    Ok(Json(json!({ "paused": paused })))
}

/// `POST /api/queues/{queue}/schedules/{name}/run-now`: one slot's jobs, now.
pub(crate) async fn run_now(
    State(state): State<AppState>,
    Path((q, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let fired = state
        .backend
        .run_schedule_now(queue(&q)?, name_of(&name)?)
        .await?;
    tracing::info!(queue = %q, schedule = %name, "relayq-dashboard: schedule run now");
    Ok(Json(match fired {
        Fired::Made { batch, jobs } => json!({
            "batch": batch.map(|b| b.0),
            "jobs": jobs.iter().map(|e| e.id.0).collect::<Vec<_>>(),
        }),
        other => json!({ "note": format!("nothing enqueued: {other:?}") }),
    }))
}
