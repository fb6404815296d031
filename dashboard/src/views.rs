//! What the API sends: the core's types, shaped for a page (payloads as text, every
//! state counted, lists with a flag saying whether more exist).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use relayq_core::{AttemptRecord, BatchId, JobId, JobInfo, JobState, Progress, redact};
use serde::Serialize;

use crate::counts::Counted;

/// A queue's counts and settings, as [`Counts`](crate::counts::Counts) gives them.
#[derive(Debug, Serialize)]
pub(crate) struct QueueView {
    pub(crate) queue: String,
    /// False while the queue's first count runs: the figures are then absent, and the
    /// page shows "counting".
    pub(crate) counted: bool,
    /// When the figures were counted: up to a second ago for a small queue, up to 30 s
    /// for one whose count is slow (docs in `counts/mod.rs`).
    pub(crate) counted_at: Option<DateTime<Utc>>,
    /// How long ago that was, by this server's clock (the browser's may differ).
    pub(crate) counted_seconds_ago: Option<f64>,
    #[serde(flatten)]
    pub(crate) figures: Option<Figures>,
    /// How many workers beat for the queue within three beats' time (SPEC M9): zero
    /// with ready jobs means nobody serves it.
    pub(crate) workers: Option<u32>,
    /// Of the running jobs, how many those workers hold claimed ahead in their
    /// buffers, by their last beats: leased, not started.
    pub(crate) held: Option<u32>,
}

/// What a count says of a queue.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    /// Every state, zero included, so a page need not know the list.
    pub(crate) counts: BTreeMap<&'static str, u64>,
    pub(crate) total: u64,
    pub(crate) running: u64,
    pub(crate) max_running: Option<u32>,
    pub(crate) paused: bool,
    /// When the longest-waiting claimable job became claimable, and how long ago
    /// that is by this server's clock: how far behind the queue is.
    pub(crate) oldest_ready: Option<DateTime<Utc>>,
    pub(crate) oldest_ready_seconds: Option<f64>,
    /// The queue's rate as text (`10/1s`), and when it allows the next start when
    /// that is not now, as of the count (SPEC K8, K11).
    pub(crate) rate: Option<String>,
    pub(crate) rate_next: Option<DateTime<Utc>>,
}

impl QueueView {
    pub(crate) fn new(queue: &str, counted: Option<Counted>) -> Self {
        let Some(Counted { stats, at, .. }) = counted else {
            return Self {
                queue: queue.to_owned(),
                counted: false,
                counted_at: None,
                counted_seconds_ago: None,
                figures: None,
                workers: None,
                held: None,
            };
        };
        Self {
            queue: queue.to_owned(),
            counted: true,
            counted_at: Some(at),
            counted_seconds_ago: Some((Utc::now() - at).as_seconds_f64().max(0.0)),
            figures: Some(Figures {
                oldest_ready: stats.oldest_ready,
                oldest_ready_seconds: stats
                    .oldest_ready_age(Utc::now())
                    .map(|age| age.as_secs_f64()),
                counts: JobState::ALL
                    .into_iter()
                    .map(|s| (s.as_str(), stats.count(s)))
                    .collect(),
                total: stats.total(),
                running: stats.count(JobState::Running),
                max_running: stats.max_running,
                paused: stats.paused,
                rate: stats.rate.map(|r| r.to_string()),
                rate_next: stats.rate_next,
            }),
            workers: None,
            held: None,
        }
    }
}

/// A job: its payload as text, secrets masked (invalid UTF-8 replaced, flagged by
/// `payload_utf8`).
#[derive(Debug, Serialize)]
pub(crate) struct JobView {
    pub(crate) id: JobId,
    pub(crate) queue: String,
    pub(crate) state: JobState,
    pub(crate) payload: String,
    pub(crate) payload_utf8: bool,
    pub(crate) priority: i16,
    pub(crate) run_at: DateTime<Utc>,
    pub(crate) attempts: u32,
    pub(crate) max_attempts: u16,
    pub(crate) group: Option<String>,
    pub(crate) batch: Option<BatchId>,
    pub(crate) stage: Option<i32>,
    pub(crate) dedupe_key: Option<String>,
    pub(crate) enqueued_by: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) attempt_log: Vec<AttemptRecord>,
    /// Its progress as last reported (SPEC L7).
    pub(crate) progress: Option<Progress>,
    /// What it left on success (SPEC L8).
    pub(crate) result: Option<String>,
    /// The jobs it runs after (SPEC D1).
    pub(crate) after: Vec<JobId>,
}

impl From<JobInfo> for JobView {
    fn from(job: JobInfo) -> Self {
        // Secret-looking fields and URLs' passwords are masked (core's `redact`), as
        // everywhere a person reads a payload.
        let payload_utf8 = std::str::from_utf8(&job.payload).is_ok();
        let payload = redact::payload(&job.payload);
        let result = job.result().map(redact::urls);
        Self {
            id: job.id,
            queue: job.queue,
            state: job.state,
            payload,
            payload_utf8,
            priority: job.priority,
            run_at: job.run_at,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            group: job.group,
            batch: job.batch,
            stage: job.stage,
            dedupe_key: job.dedupe_key,
            enqueued_by: job.enqueued_by,
            created_at: job.created_at,
            finished_at: job.finished_at,
            last_error: job.last_error.as_deref().map(redact::urls),
            attempt_log: job.attempt_log.into_iter().map(redacted).collect(),
            progress: job.progress.map(redacted_progress),
            result,
            after: job.after,
        }
    }
}

/// A progress report with the URLs' passwords in its message masked.
pub(crate) fn redacted_progress(mut p: Progress) -> Progress {
    p.message = redact::urls(&p.message);
    p
}

/// An attempt with the URLs' passwords in its error and output masked.
fn redacted(mut a: AttemptRecord) -> AttemptRecord {
    a.error = a.error.as_deref().map(redact::urls);
    a.output = a.output.as_deref().map(redact::urls);
    a
}

/// A job of a batch as its timeline needs it: no payload, every attempt.
#[derive(Debug, Serialize)]
pub(crate) struct BatchJobView {
    pub(crate) id: JobId,
    pub(crate) stage: Option<i32>,
    pub(crate) state: JobState,
    pub(crate) attempt_log: Vec<AttemptRecord>,
    /// Its name, as a job list shows it: for the dependency graph's nodes.
    pub(crate) name: String,
    /// The jobs it runs after (SPEC D1): the graph's edges.
    pub(crate) after: Vec<JobId>,
}

impl From<JobInfo> for BatchJobView {
    fn from(job: JobInfo) -> Self {
        Self {
            id: job.id,
            stage: job.stage,
            state: job.state,
            name: crate::jobs::payload_name(&job.payload),
            after: job.after,
            attempt_log: job.attempt_log.into_iter().map(redacted).collect(),
        }
    }
}

/// One page of a list: at most `limit` items, and whether more exist.
#[derive(Debug, Serialize)]
pub(crate) struct Page<T> {
    pub(crate) items: Vec<T>,
    pub(crate) limit: u32,
    pub(crate) more: bool,
}

impl<T> Page<T> {
    /// Keeps the first `limit` of `items`, which may hold one more to tell `more`.
    pub(crate) fn cut(mut items: Vec<T>, limit: u32) -> Self {
        let keep = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = items.len() > keep;
        items.truncate(keep);
        Self { items, limit, more }
    }
}
