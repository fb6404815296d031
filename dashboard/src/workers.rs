//! Who serves the queues (SPEC M9): `GET /api/workers` merges the beats every queue in
//! use has seen into one row per worker; `GET /api/queues/{q}/workers` is one queue's.

use std::collections::BTreeMap;

use axum::{
    Json,
    extract::{Path, Query, State},
};
use chrono::{DateTime, Utc};
use relayq_core::WorkerSeen;
use serde::Serialize;

use crate::{
    api::{QueuesQuery, queue, queue_names},
    error::ApiResult,
    state::AppState,
};

/// A worker as the workers page shows it.
#[derive(Debug, Serialize)]
pub(crate) struct WorkerRow {
    #[serde(flatten)]
    seen: WorkerSeen,
    /// Whether it beat within three beats' time: a worker that missed that many is
    /// taken for gone.
    alive: bool,
}

fn row(seen: WorkerSeen, now: DateTime<Utc>) -> WorkerRow {
    WorkerRow {
        alive: seen.alive(now),
        seen,
    }
}

/// `GET /api/queues/{queue}/workers`: the workers that beat for the queue in the last
/// hour, the most recent first.
pub(crate) async fn of_queue(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<WorkerRow>>> {
    let now = Utc::now();
    let seen = state.backend.workers(queue(&name)?).await?;
    Ok(Json(seen.into_iter().map(|s| row(s, now)).collect()))
}

/// `GET /api/workers?queues=a,b`: every worker that beat for a listed queue in the
/// last hour, once each with its latest beat; alive ones first, then by name.
pub(crate) async fn all(
    State(state): State<AppState>,
    Query(q): Query<QueuesQuery>,
) -> ApiResult<Json<Vec<WorkerRow>>> {
    let names = queue_names(&state, q.queues.as_deref()).await?;
    let mut latest: BTreeMap<String, WorkerSeen> = BTreeMap::new();
    for name in &names {
        for seen in state.backend.workers(name).await? {
            match latest.get(&seen.beat.worker) {
                Some(known) if known.last_seen >= seen.last_seen => {}
                _ => {
                    latest.insert(seen.beat.worker.clone(), seen);
                }
            }
        }
    }
    let now = Utc::now();
    let mut rows: Vec<WorkerRow> = latest.into_values().map(|s| row(s, now)).collect();
    rows.sort_by(|a, b| {
        b.alive
            .cmp(&a.alive)
            .then_with(|| a.seen.beat.worker.cmp(&b.seen.beat.worker))
    });
    Ok(Json(rows))
}

/// How many workers beat for `queue` within three beats' time (the queue list's "no
/// worker" warning), and how many jobs they hold claimed ahead in their buffers: leased,
/// so counted running by the backend, but not started.
pub(crate) async fn alive(state: &AppState, queue: &str) -> ApiResult<(u32, u32)> {
    let now = Utc::now();
    let seen = state.backend.workers(queue).await?;
    let alive: Vec<&WorkerSeen> = seen.iter().filter(|s| s.alive(now)).collect();
    let held = alive
        .iter()
        .map(|s| s.beat.held)
        .fold(0u32, u32::saturating_add);
    Ok((u32::try_from(alive.len()).unwrap_or(u32::MAX), held))
}

/// [`alive`] for each of `names`, read at once (the queue list polls every second);
/// `None` for a queue whose beats could not be read, so one failure does not fail the
/// list.
pub(crate) async fn alive_many(state: &AppState, names: &[String]) -> Vec<Option<(u32, u32)>> {
    let mut out = vec![None; names.len()];
    // Eight at a time, as the timeline reads jobs: a pool the workers may share stays
    // theirs too.
    for (c, chunk) in names.chunks(8).enumerate() {
        let mut reads = tokio::task::JoinSet::new();
        for (i, name) in chunk.iter().enumerate() {
            let (state, name) = (state.clone(), name.clone());
            reads.spawn(async move { (c * 8 + i, alive(&state, &name).await.ok()) });
        }
        while let Some(done) = reads.join_next().await {
            if let Ok((i, seen)) = done {
                out[i] = seen;
            }
        }
    }
    out
}
