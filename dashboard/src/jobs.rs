//! Finding jobs (SPEC M7): `GET /api/queues/{queue}/jobs` lists a queue's jobs by
//! filter, newest first, a page at a time; `POST .../jobs/bulk` cancels, retries,
//! deletes or runs now the selected jobs, or every job a filter matches.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
};
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, BatchId, ErrorKind, JobFilter, JobId, JobInfo, JobState, Progress, redact,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    api::{DEFAULT_LIMIT, MAX_LIMIT, id, queue, read_jobs},
    counts::Change,
    error::{ApiError, ApiResult},
    state::AppState,
    views::redacted_progress,
};

/// `?state=&batch=&stage=&group=&text=&before=&limit=`, kept as text so that a bad
/// value is an error naming its field.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct JobsQuery {
    state: Option<String>,
    batch: Option<String>,
    stage: Option<String>,
    group: Option<String>,
    text: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

/// An empty field of the filter form means "any".
fn given(v: Option<&String>) -> Option<&str> {
    v.map(String::as_str).filter(|s| !s.is_empty())
}

impl JobsQuery {
    fn filter(&self) -> ApiResult<JobFilter> {
        let number = |field: &'static str, v: Option<&String>| -> ApiResult<Option<i64>> {
            given(v).map(|t| id(field, t)).transpose()
        };
        let filter = JobFilter {
            state: given(self.state.as_ref())
                .map(|s| {
                    s.parse::<JobState>()
                        .map_err(|_| ApiError::invalid("state", format!("unknown state {s:?}")))
                })
                .transpose()?,
            batch: number("batch", self.batch.as_ref())?.map(BatchId),
            stage: number("stage", self.stage.as_ref())?
                .map(|s| {
                    i32::try_from(s).map_err(|_| ApiError::invalid("stage", "is out of range"))
                })
                .transpose()?,
            group: given(self.group.as_ref()).map(str::to_owned),
            text: given(self.text.as_ref()).map(str::to_owned),
        };
        filter.validate()?;
        Ok(filter)
    }

    fn limit(&self) -> ApiResult<u32> {
        match given(self.limit.as_ref()) {
            None => Ok(DEFAULT_LIMIT),
            Some(t) => t
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::invalid("limit", format!("expected 1..={MAX_LIMIT}, got {t:?}"))
                }),
        }
    }
}

/// A job as a list shows it: what it is (its name, else its command, else the start
/// of its payload, secrets masked), where it stands and its last error's first line.
#[derive(Debug, Serialize)]
pub(crate) struct JobRow {
    id: JobId,
    state: JobState,
    name: String,
    batch: Option<BatchId>,
    stage: Option<i32>,
    group: Option<String>,
    attempts: u32,
    max_attempts: u16,
    created_at: DateTime<Utc>,
    run_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    /// The running attempt's worker and start.
    worker: Option<String>,
    started_at: Option<DateTime<Utc>>,
    progress: Option<Progress>,
    error: Option<String>,
}

/// How much of a payload or an error a list row shows.
const SHOWN: usize = 120;

fn cut(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= SHOWN {
        return line.to_owned();
    }
    let mut out: String = line.chars().take(SHOWN - 1).collect();
    out.push('…');
    out
}

/// A payload's name for a list: the `name` field of a JSON object, else its `command`,
/// else the payload itself; masked first, so no secret shows.
pub(crate) fn payload_name(payload: &[u8]) -> String {
    let text = redact::payload(payload);
    let json: Option<Value> = serde_json::from_str(&text).ok();
    let field = |k| json.as_ref().and_then(|v| v.get(k)).and_then(Value::as_str);
    cut(field("name").or_else(|| field("command")).unwrap_or(&text))
}

impl From<JobInfo> for JobRow {
    fn from(j: JobInfo) -> Self {
        let running = j
            .attempt_log
            .iter()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Running);
        Self {
            id: j.id,
            state: j.state,
            name: payload_name(&j.payload),
            batch: j.batch,
            stage: j.stage,
            group: j.group,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            created_at: j.created_at,
            run_at: j.run_at,
            finished_at: j.finished_at,
            worker: running.map(|a| a.worker.clone()),
            started_at: running.map(|a| a.started_at),
            progress: j.progress.map(redacted_progress),
            error: j.last_error.as_deref().map(|e| cut(&redact::urls(e))),
        }
    }
}

/// A page of a job list, with the cursor of the next (SPEC M7): a page may be short,
/// or empty, and still have a `next` when the backend stopped after looking at its
/// share of jobs.
#[derive(Debug, Serialize)]
pub(crate) struct JobsPage {
    items: Vec<JobRow>,
    limit: u32,
    next: Option<JobId>,
}

/// `GET /api/queues/{queue}/jobs?state=&batch=&stage=&group=&text=&before=&limit=`.
pub(crate) async fn list(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<JobsQuery>,
) -> ApiResult<Json<JobsPage>> {
    let name = queue(&name)?;
    let filter = q.filter()?;
    let limit = q.limit()?;
    let before = before_of(&q)?;
    let page = state
        .backend
        .list_jobs(name, &filter, before, limit)
        .await?;
    let jobs = read_jobs(&state, name, &page.jobs).await?;
    Ok(Json(JobsPage {
        items: jobs
            .into_iter()
            .filter(|j| shown_match(j, filter.text.as_deref()))
            .map(JobRow::from)
            .collect(),
        limit,
        next: page.next,
    }))
}

fn before_of(q: &JobsQuery) -> ApiResult<Option<JobId>> {
    Ok(given(q.before.as_ref())
        .map(|b| id("before", b))
        .transpose()?
        .map(JobId))
}

/// Whether `text` is in what a person may read of the job: its payload and last error
/// with secrets masked. The backends search the stored bytes, so without this a filter
/// typed one character at a time would spell out a masked secret.
fn shown_match(job: &JobInfo, text: Option<&str>) -> bool {
    text.is_none_or(|t| {
        redact::payload(&job.payload).contains(t)
            || job
                .last_error
                .as_deref()
                .is_some_and(|e| redact::urls(e).contains(t))
    })
}

/// The most jobs one bulk action touches: an action on "every job that matches" a
/// filter of a million jobs is done in parts, each answer saying whether more match.
pub(crate) const BULK_MAX: usize = 10_000;

/// What a bulk action does to each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BulkAction {
    /// Cancel it, if unfinished (SPEC B7).
    Cancel,
    /// Put it back to ready, if dead and not in a batch (SPEC M2).
    Retry,
    /// Delete it, if finished (SPEC M8).
    Delete,
    /// Make it due now, if it waits only for its time (SPEC M10).
    RunNow,
}

/// `{"action": "cancel"|"retry"|"delete"|"run_now", "ids": [..]}`, or `"filter": {..}` (the list's query
/// fields) for every job that matches.
#[derive(Debug, Deserialize)]
struct BulkBody {
    action: BulkAction,
    ids: Option<Vec<i64>>,
    filter: Option<JobsQuery>,
}

/// A bulk action's body, checked: the action, and the ids named or the filter with
/// where to go on from.
type Bulk = (
    BulkAction,
    Option<Vec<JobId>>,
    Option<(JobFilter, Option<JobId>)>,
);

fn parse_bulk(body: &[u8]) -> ApiResult<Bulk> {
    let body: BulkBody = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "body",
            format!("expected JSON with action and ids or filter: {e}"),
        )
    })?;
    match (body.ids, body.filter) {
        (Some(ids), None) => {
            if ids.is_empty() || ids.len() > BULK_MAX {
                return Err(ApiError::invalid(
                    "ids",
                    format!("expected 1 to {BULK_MAX} ids, got {}", ids.len()),
                ));
            }
            Ok((
                body.action,
                Some(ids.into_iter().map(JobId).collect()),
                None,
            ))
        }
        (None, Some(q)) => Ok((body.action, None, Some((q.filter()?, before_of(&q)?)))),
        _ => Err(ApiError::invalid("ids", "give either ids or filter")),
    }
}

/// `POST /api/queues/{queue}/jobs/bulk`: cancels, retries, deletes or runs now each job named,
/// or each that the filter matches (up to [`BULK_MAX`] a call); says how many changed,
/// how many were left as they were and why, and where to go on from when more match.
pub(crate) async fn bulk(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let name = queue(&name)?;
    let (action, ids, filter) = parse_bulk(&body)?;
    let (ids, next) = match (ids, filter) {
        (Some(ids), _) => (ids, None),
        (None, filter) => {
            let (filter, before) = filter.unwrap_or_default();
            matching(&state, name, &filter, before, action).await?
        }
    };
    let more = next.is_some();
    let changed = apply(&state, name, action, &ids).await?;
    state.counts.changed(name, Change::Jobs);
    let unchanged = ids.len() as u64 - changed;
    tracing::info!(queue = %name, ?action, changed, unchanged, more, "relayq-dashboard: bulk action");
    let what = match action {
        BulkAction::Cancel => "cancelled",
        BulkAction::Retry => "retried",
        BulkAction::Delete => "deleted",
        BulkAction::RunNow => "due_now",
    };
    // Say what was left alone, and why, rather than let a short count look like all.
    let why = match action {
        BulkAction::Cancel => "already finished",
        BulkAction::Retry => "not dead, in a batch, or holding a dedupe key another job has",
        BulkAction::Delete => "not finished: cancel them first",
        BulkAction::RunNow => {
            "not waiting for their time only: due already, running, finished or blocked"
        }
    };
    let mut note =
        (unchanged > 0).then(|| format!("{changed} {what}; {unchanged} left as they were ({why})"));
    if more {
        let more_note = format!("more than {BULK_MAX} jobs match: go on from `next` for the rest");
        note = Some(note.map_or(more_note.clone(), |n| format!("{n}; {more_note}")));
    }
    Ok(Json(json!({
        what: changed,
        "unchanged": unchanged,
        "more": more,
        "next": next,
        "note": note,
    })))
}

/// Does `action` to each of `ids`; returns how many it changed. A job pruned or deleted
/// since it was listed is left out, not an error.
async fn apply(state: &AppState, queue: &str, action: BulkAction, ids: &[JobId]) -> ApiResult<u64> {
    let b = &state.backend;
    let mut n = 0;
    match action {
        BulkAction::Cancel => {
            for id in ids {
                match b.cancel_job(queue, *id).await {
                    Ok(done) => n += u64::from(done),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        BulkAction::Retry => {
            for chunk in ids.chunks(1000) {
                n += b.retry_dead(queue, Some(chunk)).await?;
            }
        }
        BulkAction::Delete => {
            for chunk in ids.chunks(1000) {
                n += b.delete_jobs(queue, chunk).await?;
            }
        }
        BulkAction::RunNow => {
            for chunk in ids.chunks(1000) {
                n += b.run_now(queue, chunk).await?;
            }
        }
    }
    Ok(n)
}

/// The jobs a filter matches below `before`, up to [`BULK_MAX`], and where the next
/// call goes on from when more may match: calls never act on the same jobs twice, so
/// jobs the action leaves as they are cannot keep it from reaching older ones. A retry
/// looks at dead jobs unless the filter names a state; a cancel or a delete at every
/// job that matches, leaving those it cannot change. A text matches as a person reads
/// the job, secrets masked ([`shown_match`]).
async fn matching(
    state: &AppState,
    queue: &str,
    filter: &JobFilter,
    before: Option<JobId>,
    action: BulkAction,
) -> ApiResult<(Vec<JobId>, Option<JobId>)> {
    let mut filter = filter.clone();
    if action == BulkAction::Retry && filter.state.is_none() {
        filter.state = Some(JobState::Dead);
    }
    let mut out = Vec::new();
    let mut before = before;
    loop {
        let room = u32::try_from(BULK_MAX - out.len())
            .unwrap_or(1000)
            .min(1000);
        let page = state
            .backend
            .list_jobs(queue, &filter, before, room)
            .await?;
        let mut ids = page.jobs;
        if filter.text.is_some() {
            let jobs = read_jobs(state, queue, &ids).await?;
            ids = jobs
                .iter()
                .filter(|j| shown_match(j, filter.text.as_deref()))
                .map(|j| j.id)
                .collect();
        }
        out.extend(ids);
        match page.next {
            Some(next) if out.len() >= BULK_MAX => return Ok((out, Some(next))),
            Some(next) => before = Some(next),
            None => return Ok((out, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: &ApiError) -> String {
        format!("{e:?}")
    }

    #[test]
    fn bad_queries_name_their_field() {
        for (q, field) in [
            (
                JobsQuery {
                    state: Some("sleeping".into()),
                    ..JobsQuery::default()
                },
                "state",
            ),
            (
                JobsQuery {
                    batch: Some("x".into()),
                    ..JobsQuery::default()
                },
                "batch",
            ),
            (
                JobsQuery {
                    stage: Some("99999999999".into()),
                    ..JobsQuery::default()
                },
                "stage",
            ),
            (
                JobsQuery {
                    text: Some("x".repeat(300)),
                    ..JobsQuery::default()
                },
                "text",
            ),
        ] {
            let e = q.filter().unwrap_err();
            assert!(field_of(&e).contains(field), "{q:?}: {e:?}");
        }
        let empty = JobsQuery {
            state: Some(String::new()),
            text: Some(String::new()),
            ..JobsQuery::default()
        };
        assert_eq!(empty.filter().unwrap(), JobFilter::all());
        let bad_limit = JobsQuery {
            limit: Some("0".into()),
            ..JobsQuery::default()
        };
        assert!(field_of(&bad_limit.limit().unwrap_err()).contains("limit"));
    }

    #[test]
    fn bulk_bodies_are_checked() {
        let (a, ids, f) = parse_bulk(br#"{"action":"cancel","ids":[3,4]}"#).unwrap();
        assert_eq!(
            (a, ids, f),
            (BulkAction::Cancel, Some(vec![JobId(3), JobId(4)]), None)
        );
        let (a, ids, f) =
            parse_bulk(br#"{"action":"retry","filter":{"text":"disk","before":"9"}}"#).unwrap();
        assert_eq!((a, ids), (BulkAction::Retry, None));
        assert_eq!(f.unwrap(), (JobFilter::all().text("disk"), Some(JobId(9))));
        for (bad, field) in [
            (&br#"{"action":"explode","ids":[1]}"#[..], "body"),
            (br#"{"action":"cancel"}"#, "ids"),
            (br#"{"action":"cancel","ids":[]}"#, "ids"),
            (br#"{"action":"cancel","ids":[1],"filter":{}}"#, "ids"),
            (br#"{"action":"cancel","filter":{"state":"nope"}}"#, "state"),
        ] {
            let e = parse_bulk(bad).unwrap_err();
            assert!(
                field_of(&e).contains(field),
                "{}: {e:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn names_come_from_the_payload_with_secrets_masked() {
        assert_eq!(
            payload_name(br#"{"name":"load orders","command":"x"}"#),
            "load orders"
        );
        assert_eq!(payload_name(br#"{"command":"echo hi"}"#), "echo hi");
        assert_eq!(payload_name(b"plain bytes\nsecond line"), "plain bytes");
        let leaked = payload_name(br#"{"command":"psql postgres://u:hunter2@db/x"}"#);
        assert!(!leaked.contains("hunter2"), "{leaked}");
        assert_eq!(payload_name(&vec![b'a'; 500]).chars().count(), SHOWN);
    }
}
