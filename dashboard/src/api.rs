//! The read side of the JSON API: what the pages poll.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, Query, State},
    http::StatusCode,
};
use relayq_core::{
    Batch, BatchId, BatchProgress, ErrorKind, JobId, JobInfo, RunningJob, validate::queue_name,
};
use serde::{Deserialize, Serialize};

use crate::{
    error::{ApiError, ApiResult},
    state::AppState,
    views::{BatchJobView, JobView, Page, QueueView},
};

/// The default page size of every list.
pub(crate) const DEFAULT_LIMIT: u32 = 50;
/// The largest page size, as the backends allow.
pub(crate) const MAX_LIMIT: u32 = 1000;

/// `?queues=a,b`: queues to list beside the configured ones.
#[derive(Debug, Deserialize)]
pub(crate) struct QueuesQuery {
    pub(crate) queues: Option<String>,
}

/// `?limit=N`, kept as text so that a bad value is an error naming `limit`.
#[derive(Debug, Deserialize)]
pub(crate) struct LimitQuery {
    limit: Option<String>,
}

impl LimitQuery {
    fn get(&self) -> ApiResult<u32> {
        let Some(text) = self.limit.as_deref() else {
            return Ok(DEFAULT_LIMIT);
        };
        match text.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                "limit",
                format!("expected 1..={MAX_LIMIT}, got {text:?}"),
            )),
        }
    }
}

/// Checks a queue name taken from the URL.
pub(crate) fn queue(name: &str) -> ApiResult<&str> {
    queue_name(name)?;
    Ok(name)
}

/// Parses an id taken from the URL, naming `field` when it is not a number.
pub(crate) fn id(field: &'static str, text: &str) -> ApiResult<i64> {
    text.parse()
        .map_err(|_| ApiError::invalid(field, format!("expected a number, got {text:?}")))
}

/// How many queues `?queues=` may add: each costs one `queue_stats` call per poll.
pub(crate) const MAX_EXTRA_QUEUES: usize = 50;

/// How many of the queues in use the list shows: each costs one `queue_stats` call per
/// poll.
pub(crate) const MAX_LISTED: usize = 200;

/// The queues to list: the configured ones, those in use, then those the query adds,
/// each once.
pub(crate) async fn queue_names(state: &AppState, extra: Option<&str>) -> ApiResult<Vec<String>> {
    let mut names = state.options.queues.clone();
    for name in state.backend.queues().await?.into_iter().take(MAX_LISTED) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let extra: Vec<&str> = extra
        .unwrap_or("")
        .split(',')
        .filter(|n| !n.is_empty())
        .collect();
    if extra.len() > MAX_EXTRA_QUEUES {
        return Err(ApiError::invalid(
            "queues",
            format!("at most {MAX_EXTRA_QUEUES} names, got {}", extra.len()),
        ));
    }
    for name in extra {
        queue_name(name)?;
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// `GET /api/queues`.
pub(crate) async fn queues(
    State(state): State<AppState>,
    Query(q): Query<QueuesQuery>,
) -> ApiResult<Json<Vec<QueueView>>> {
    let names = queue_names(&state, q.queues.as_deref()).await?;
    let answers = state.counts.get_many(&names).await;
    let mut beats = crate::workers::alive_many(&state, &names).await;
    let mut out = Vec::with_capacity(names.len());
    for ((name, answer), beat) in names.iter().zip(answers).zip(beats.drain(..)) {
        let mut view = QueueView::new(name, answer?);
        (view.workers, view.held) = beat.map_or((None, None), |(n, held)| (Some(n), Some(held)));
        out.push(view);
    }
    Ok(Json(out))
}

/// `GET /api/queues/{queue}`.
pub(crate) async fn queue_stats(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<QueueView>> {
    let name = queue(&name)?;
    let mut view = QueueView::new(name, state.counts.get(name).await?);
    // Who serves it is secondary: a failed read of the beats leaves it unknown.
    (view.workers, view.held) = crate::workers::alive(&state, name)
        .await
        .map_or((None, None), |(n, held)| (Some(n), Some(held)));
    Ok(Json(view))
}

/// `GET /api/queues/{queue}/keys`: the queue's limit keys with their running counts
/// and limits (SPEC K7).
pub(crate) async fn keys(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<relayq_core::KeyLimits>> {
    let name = queue(&name)?;
    Ok(Json(state.backend.key_limits(name).await?))
}

/// `GET /api/queues/{queue}/history`: the queue's counts as sampled while this
/// dashboard counted it (every 5 s at most, the last hour), for the charts; counts the
/// queue first, so a chart opened alone still gathers samples.
pub(crate) async fn history(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let name = queue(&name)?;
    state.counts.get(name).await?;
    Ok(Json(serde_json::json!({
        "every_seconds": crate::counts::history::EVERY.num_seconds(),
        "samples": state.counts.history(name),
    })))
}

/// `GET /api/queues/{queue}/batches?limit=N`: newest first.
pub(crate) async fn batches(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(limit): Query<LimitQuery>,
) -> ApiResult<Json<Page<BatchProgress>>> {
    let limit = limit.get()?;
    let items = state
        .backend
        .batches(queue(&name)?, (limit + 1).min(MAX_LIMIT))
        .await?;
    Ok(Json(Page::cut(items, limit)))
}

/// `GET /api/queues/{queue}/batches/{id}`.
pub(crate) async fn batch(
    State(state): State<AppState>,
    Path((name, batch)): Path<(String, String)>,
) -> ApiResult<Json<BatchProgress>> {
    let batch = Batch {
        queue: queue(&name)?.to_owned(),
        id: BatchId(id("batch", &batch)?),
    };
    Ok(Json(state.backend.batch_progress(&batch).await?))
}

/// `?after=ID&limit=N` of a batch's jobs.
#[derive(Debug, Deserialize)]
pub(crate) struct AfterQuery {
    after: Option<String>,
    #[serde(flatten)]
    limit: LimitQuery,
}

/// How many job reads of one timeline page run at once: enough to hide round trips,
/// few enough to leave the pool, which workers may share, to others.
const READS_AT_ONCE: usize = 8;

/// `GET /api/queues/{queue}/batches/{id}/jobs?after=ID&limit=N`: the batch's jobs in id
/// order, after `after`, each with its stage, state and every attempt (worker, start,
/// end, outcome): what the batch page draws as a timeline of attempts by worker.
/// `next` is the `after` of the next page (the last id listed, even when that job was
/// pruned before it could be read), or null on the last page.
pub(crate) async fn batch_jobs(
    State(state): State<AppState>,
    Path((name, batch)): Path<(String, String)>,
    Query(q): Query<AfterQuery>,
) -> ApiResult<Json<BatchJobsPage>> {
    let limit = q.limit.get()?;
    let after = q.after.as_deref().map(|a| id("after", a)).transpose()?;
    let batch = Batch {
        queue: queue(&name)?.to_owned(),
        id: BatchId(id("batch", &batch)?),
    };
    let b = &state.backend;
    let ids = b
        .batch_jobs(&batch, after.map(JobId), (limit + 1).min(MAX_LIMIT))
        .await?;
    let mut page = Page::cut(ids, limit);
    // A page of the largest size could not ask for one more: ask what follows.
    if !page.more
        && let Some(&last) = page.items.last().filter(|_| limit == MAX_LIMIT)
    {
        page.more = !b.batch_jobs(&batch, Some(last), 1).await?.is_empty();
    }
    let next = page.items.last().filter(|_| page.more).copied();
    let jobs = read_jobs(&state, &batch.queue, &page.items).await?;
    Ok(Json(BatchJobsPage {
        items: jobs.into_iter().map(BatchJobView::from).collect(),
        limit,
        more: page.more,
        next,
    }))
}

/// Each of `ids` read with its log, in that order, [`READS_AT_ONCE`] at a time; a job
/// pruned between its listing and its read is left out.
pub(crate) async fn read_jobs(
    state: &AppState,
    queue: &str,
    ids: &[JobId],
) -> ApiResult<Vec<JobInfo>> {
    let mut jobs = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(READS_AT_ONCE) {
        let mut reads = tokio::task::JoinSet::new();
        for (i, &job) in chunk.iter().enumerate() {
            let backend = Arc::clone(&state.backend);
            let queue = queue.to_owned();
            reads.spawn(async move { (i, backend.job(&queue, job).await) });
        }
        let mut read = Vec::with_capacity(chunk.len());
        while let Some(done) = reads.join_next().await {
            let (i, job) = done.map_err(|e| {
                tracing::warn!(error = %e, "relayq-dashboard: a job read panicked");
                ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "a job read failed")
            })?;
            match job {
                Ok(job) => read.push((i, job)),
                // Pruned between the listing and the read.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        read.sort_by_key(|(i, _)| *i);
        jobs.extend(read.into_iter().map(|(_, j)| j));
    }
    Ok(jobs)
}

/// A page of a batch's jobs, with the cursor of the next.
#[derive(Debug, Serialize)]
pub(crate) struct BatchJobsPage {
    items: Vec<BatchJobView>,
    limit: u32,
    more: bool,
    next: Option<JobId>,
}

/// A running job with what it is: its name (as a job list shows it), batch and stage.
#[derive(Debug, Serialize)]
pub(crate) struct RunningView {
    #[serde(flatten)]
    run: RunningJob,
    name: Option<String>,
    batch: Option<BatchId>,
    stage: Option<i32>,
}

/// `GET /api/queues/{queue}/running?limit=N`: oldest attempt first, each job read for
/// its name, batch and stage.
pub(crate) async fn running(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(limit): Query<LimitQuery>,
) -> ApiResult<Json<Page<RunningView>>> {
    let limit = limit.get()?;
    let name = queue(&name)?;
    // The trait has no limit here: running jobs are bounded by the workers' slots.
    let mut items = state.backend.running(name).await?;
    items.sort_by_key(|r| (r.started_at, r.id));
    let page = Page::cut(items, limit);
    let ids: Vec<JobId> = page.items.iter().map(|r| r.id).collect();
    let jobs = read_jobs(&state, name, &ids).await?;
    let items = page
        .items
        .into_iter()
        .map(|mut run| {
            run.progress = run.progress.take().map(crate::views::redacted_progress);
            // A job finished between the two reads shows without its name.
            let job = jobs.iter().find(|j| j.id == run.id);
            RunningView {
                name: job.map(|j| crate::jobs::payload_name(&j.payload)),
                batch: job.and_then(|j| j.batch),
                stage: job.and_then(|j| j.stage),
                run,
            }
        })
        .collect();
    Ok(Json(Page {
        items,
        limit: page.limit,
        more: page.more,
    }))
}

/// `GET /api/queues/{queue}/dead?limit=N`: in enqueue order.
pub(crate) async fn dead(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(limit): Query<LimitQuery>,
) -> ApiResult<Json<Page<JobView>>> {
    let limit = limit.get()?;
    let items = state
        .backend
        .dead_jobs(queue(&name)?, (limit + 1).min(MAX_LIMIT))
        .await?;
    Ok(Json(Page::cut(
        items.into_iter().map(JobView::from).collect(),
        limit,
    )))
}

/// `GET /api/queues/{queue}/jobs/{id}/why`: what holds the job back, in words (SPEC
/// M6).
pub(crate) async fn why(
    State(state): State<AppState>,
    Path((name, job)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let job = JobId(id("job", &job)?);
    let why = relayq_core::InspectExt::why(&*state.backend, queue(&name)?, job).await?;
    Ok(Json(serde_json::json!({ "why": why.lines() })))
}

/// `GET /api/queues/{queue}/jobs/{id}`: the job with every attempt.
pub(crate) async fn job(
    State(state): State<AppState>,
    Path((name, job)): Path<(String, String)>,
) -> ApiResult<Json<JobView>> {
    let job = JobId(id("job", &job)?);
    Ok(Json(state.backend.job(queue(&name)?, job).await?.into()))
}
