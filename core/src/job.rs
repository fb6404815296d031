//! Jobs as callers describe them ([`NewJob`]) and the states they move through.

use std::{fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{After, AfterFailure, BatchId, Error, Result};

/// A job's id: assigned by the backend, increasing in enqueue order within a queue.
///
/// Ids are unique within their queue; every call that names a job also names its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// When a job may first run. Times are judged by the backend server's clock (SPEC E2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as possible (server time at enqueue).
    #[default]
    Now,
    /// This long after the server's time at enqueue.
    After(Duration),
    /// Not before this instant.
    At(DateTime<Utc>),
}

impl RunAt {
    /// The instant this resolves to, given the server's `now`.
    #[must_use]
    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Self::Now => now,
            Self::After(d) => {
                now + chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
            }
            Self::At(t) => t,
        }
    }
}

/// Default number of attempts a job gets.
pub const DEFAULT_MAX_ATTEMPTS: u16 = 3;

/// A job to enqueue. Build it with [`NewJob::new`] and the chained setters.
///
/// ```
/// use relayq_core::NewJob;
/// let job = NewJob::new("mail", b"hello".to_vec())
///     .priority(-1)
///     .group("customer-42")
///     .max_attempts(5);
/// assert_eq!(job.priority, -1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewJob {
    /// Queue name (SPEC: 1 to 128 bytes of `A-Z a-z 0-9 _ - . :`).
    pub queue: String,
    /// Opaque payload; 0 bytes allowed, at most the backend's payload limit.
    pub payload: Vec<u8>,
    /// Lower runs first. Default 0.
    pub priority: i16,
    /// Not before. Default now.
    pub run_at: RunAt,
    /// 1..=1000, default 3.
    pub max_attempts: u16,
    /// Jobs of one group never run at the same time and run in order (SPEC G).
    pub group: Option<String>,
    /// The batch the job joins (SPEC B).
    pub batch: Option<BatchId>,
    /// The job's stage in its batch; requires `batch`. Default 0 when `batch` is set.
    pub stage: Option<i32>,
    /// While an unfinished job of the queue has this key, enqueue returns it instead
    /// (SPEC E3).
    pub dedupe_key: Option<String>,
    /// Who asked for the job (free text, for the execution log).
    pub enqueued_by: Option<String>,
    /// The key whose limit the job runs under (SPEC K1): at most the queue's limit for
    /// this key run at once.
    pub limit_key: Option<String>,
    /// The jobs of its batch it runs after (SPEC D1): it starts only once each of them
    /// succeeded. Requires `batch`.
    pub after: Vec<After>,
    /// What it does when one of `after` ends dead or cancelled (SPEC D4); `None` takes
    /// its batch's policy.
    pub after_failure: Option<AfterFailure>,
}

impl NewJob {
    /// A job for `queue` with raw `payload` bytes and every other field at its default.
    pub fn new(queue: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            queue: queue.into(),
            payload: payload.into(),
            priority: 0,
            run_at: RunAt::Now,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            group: None,
            batch: None,
            stage: None,
            dedupe_key: None,
            enqueued_by: None,
            limit_key: None,
            after: Vec::new(),
            after_failure: None,
        }
    }

    /// A job whose payload is `value` serialized as JSON.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on field `payload` when `value` cannot be serialized.
    pub fn json<T: Serialize + ?Sized>(queue: impl Into<String>, value: &T) -> Result<Self> {
        let payload = serde_json::to_vec(value)
            .map_err(|e| Error::invalid("payload", format!("not serializable as JSON: {e}")))?;
        Ok(Self::new(queue, payload))
    }

    /// Sets the priority (lower runs first).
    #[must_use]
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Runs the job no earlier than `at`.
    #[must_use]
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = RunAt::At(at);
        self
    }

    /// Runs the job no earlier than `delay` after enqueue (server time).
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.run_at = RunAt::After(delay);
        self
    }

    /// Sets how many attempts the job gets (1..=1000).
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u16) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Puts the job in a mutual-exclusion group.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Adds the job to `batch` (a [`Batch`](crate::Batch) or its id) at `stage`.
    #[must_use]
    pub fn in_batch(mut self, batch: impl Into<BatchId>, stage: i32) -> Self {
        self.batch = Some(batch.into());
        self.stage = Some(stage);
        self
    }

    /// Sets the stage alone (the batch must be set too, or enqueue rejects the job).
    #[must_use]
    pub fn stage(mut self, stage: i32) -> Self {
        self.stage = Some(stage);
        self
    }

    /// Sets the deduplication key.
    #[must_use]
    pub fn dedupe_key(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }

    /// Records who enqueued the job.
    #[must_use]
    pub fn enqueued_by(mut self, who: impl Into<String>) -> Self {
        self.enqueued_by = Some(who.into());
        self
    }

    /// Runs the job after `job`, a job already stored in the same batch (SPEC D1).
    #[must_use]
    pub fn after(mut self, job: JobId) -> Self {
        self.after.push(After::Job(job));
        self
    }

    /// Runs the job after the job at `index` of the same enqueue call (SPEC D1).
    ///
    /// ```
    /// use relayq_core::{BatchId, NewJob};
    /// let batch = BatchId(1);
    /// let jobs = vec![
    ///     NewJob::new("etl", b"extract orders".to_vec()).in_batch(batch, 0),
    ///     NewJob::new("etl", b"extract customers".to_vec()).in_batch(batch, 0),
    ///     NewJob::new("etl", b"load orders".to_vec())
    ///         .in_batch(batch, 0)
    ///         .after_call(0)
    ///         .after_call(1),
    /// ];
    /// assert_eq!(jobs[2].after.len(), 2);
    /// ```
    #[must_use]
    pub fn after_call(mut self, index: usize) -> Self {
        self.after.push(After::Call(index));
        self
    }

    /// Sets what the job does when a job it runs after ends dead or cancelled
    /// (SPEC D4), instead of its batch's policy.
    #[must_use]
    pub fn after_failure(mut self, policy: AfterFailure) -> Self {
        self.after_failure = Some(policy);
        self
    }

    /// Runs the job under `key`'s limit (SPEC K1), for example the database it works on.
    #[must_use]
    pub fn limit_key(mut self, key: impl Into<String>) -> Self {
        self.limit_key = Some(key.into());
        self
    }
}

/// What enqueue did with one job (SPEC E1, E3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id: new, or the existing job's when deduplicated.
    pub id: JobId,
    /// True when an unfinished job with the same dedupe key already existed and nothing
    /// was stored.
    pub deduplicated: bool,
}

/// A job's state (see SPEC "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// `run_at` is in the future.
    Scheduled,
    /// May be claimed now.
    Ready,
    /// Waits for its group, its stage or the jobs it runs after.
    Blocked,
    /// Held by a lease.
    Running,
    /// Failed, waits for its backoff; still holds its group and its stage.
    Retrying,
    /// Finished successfully.
    Succeeded,
    /// Finished without success: out of attempts, permanent failure, or halted.
    Dead,
    /// Finished by cancellation.
    Cancelled,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 8] = [
        Self::Scheduled,
        Self::Ready,
        Self::Blocked,
        Self::Running,
        Self::Retrying,
        Self::Succeeded,
        Self::Dead,
        Self::Cancelled,
    ];

    /// Whether the state is terminal.
    #[must_use]
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Dead | Self::Cancelled)
    }

    /// The lower-case name used in storage and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Ready => "ready",
            Self::Blocked => "blocked",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| Error::invalid("state", format!("unknown job state {s:?}")))
    }
}
