//! What monitoring reads: counts, jobs with their attempt log, running jobs (SPEC L5, M).

use std::{collections::BTreeMap, fmt, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{BatchId, JobId, JobState, Progress};

/// Jobs per state in one queue, plus its settings (SPEC M1, C6).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Count of jobs per state; states with no job are absent.
    pub counts: BTreeMap<JobState, u64>,
    /// Whether claims are paused.
    pub paused: bool,
    /// The queue's concurrency limit, if any.
    pub max_running: Option<u32>,
    /// The queue's rate limit, if any (SPEC K8).
    #[serde(default)]
    pub rate: Option<crate::Rate>,
    /// When the rate lets the next job start, on the server's clock, if that is later
    /// than now (SPEC K11).
    #[serde(default)]
    pub rate_next: Option<DateTime<Utc>>,
    /// When the longest-waiting job that a claim could take now became claimable: the
    /// earliest `run_at` of the queue's due `ready` and `retrying` jobs (SPEC M1).
    /// `None` when no job waits. How far behind the queue is: operators alert on
    /// [`QueueStats::oldest_ready_age`].
    #[serde(default)]
    pub oldest_ready: Option<DateTime<Utc>>,
}

impl QueueStats {
    /// How long the longest-waiting claimable job has waited at `now`; zero for a
    /// `run_at` ahead of `now` (clocks of two machines), `None` when no job waits.
    #[must_use]
    pub fn oldest_ready_age(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.oldest_ready
            .map(|t| (now - t).to_std().unwrap_or_default())
    }

    /// The number of jobs in `state`.
    #[must_use]
    pub fn count(&self, state: JobState) -> u64 {
        self.counts.get(&state).copied().unwrap_or(0)
    }

    /// The number of jobs in all states.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// Why a running attempt was cancelled: its log record's `error` (SPEC B8).
pub mod cancelled_by {
    /// `cancel_job` of the job.
    pub const JOB: &str = "cancelled while running: the job was cancelled";
    /// `cancel_batch` of its batch.
    pub const BATCH: &str = "cancelled while running: its batch was cancelled";
    /// A job of its `Halt` batch died (SPEC B6).
    pub const HALT: &str = "cancelled while running: a job of its batch died, halting it";
    /// `purge` of its queue (SPEC B9).
    pub const PURGE: &str = "cancelled while running: its queue was purged";

    /// The error of a job cancelled because `parent`, a job it runs after, ended in
    /// `state`, dead or cancelled (SPEC D4).
    #[must_use]
    pub fn after(parent: crate::JobId, state: crate::JobState) -> String {
        format!("cancelled: job {parent}, which it runs after, ended {state}")
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Still running.
    Running,
    /// Completed.
    Succeeded,
    /// Failed (the job retries or is dead).
    Failed,
    /// Released; the attempt was not counted.
    Released,
    /// The lease ran out before the worker settled it.
    Expired,
    /// The job was cancelled while running.
    Cancelled,
}

impl AttemptOutcome {
    /// The lower-case name used in storage and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }
}

impl std::str::FromStr for AttemptOutcome {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        [
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Released,
            Self::Expired,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| crate::Error::invalid("outcome", format!("unknown attempt outcome {s:?}")))
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attempt in the execution log (SPEC L5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The attempt number.
    pub attempt: u32,
    /// The worker that ran it.
    pub worker: String,
    /// When its handler started (server time): its claim, plus the time the job
    /// waited in the worker's buffer when the worker said so (SPEC L5).
    pub started_at: DateTime<Utc>,
    /// When it was claimed (server time), the lease's start. `None` only for attempts
    /// logged before relayq kept it apart: see [`claimed`](Self::claimed).
    #[serde(default)]
    pub claimed_at: Option<DateTime<Utc>>,
    /// When it ended, if it has.
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error text, for failures and expiries.
    pub error: Option<String>,
    /// What the worker reported with its outcome (e.g. a command's output), if
    /// anything; at most 64 KiB.
    pub output: Option<String>,
}

impl AttemptRecord {
    /// When it was claimed: [`claimed_at`](Self::claimed_at), or the start where that
    /// was not kept.
    #[must_use]
    pub fn claimed(&self) -> DateTime<Utc> {
        self.claimed_at.unwrap_or(self.started_at)
    }
}

/// A job with its attempt log (SPEC M1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its state now.
    pub state: JobState,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its priority.
    pub priority: i16,
    /// When it may (next) run.
    pub run_at: DateTime<Utc>,
    /// Attempts counted so far.
    pub attempts: u32,
    /// Attempts it gets in all.
    pub max_attempts: u16,
    /// Its group.
    pub group: Option<String>,
    /// Its batch.
    pub batch: Option<BatchId>,
    /// Its stage.
    pub stage: Option<i32>,
    /// Its dedupe key.
    pub dedupe_key: Option<String>,
    /// Who enqueued it.
    pub enqueued_by: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it finished, if it has.
    pub finished_at: Option<DateTime<Utc>>,
    /// The last error text.
    pub last_error: Option<String>,
    /// Every attempt, oldest first.
    pub attempt_log: Vec<AttemptRecord>,
    /// Its progress as last reported, by whichever attempt (SPEC L7).
    #[serde(default)]
    pub progress: Option<Progress>,
    /// The key whose limit it runs under (SPEC K1).
    #[serde(default)]
    pub limit_key: Option<String>,
    /// The jobs it runs after, in ascending id order (SPEC D1).
    #[serde(default)]
    pub after: Vec<JobId>,
}

/// A queue's limit keys (SPEC K7).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyLimits {
    /// The limit of every key without one of its own; `None` for none.
    pub default: Option<u32>,
    /// The rate of every key without one of its own; `None` for none (SPEC K12).
    #[serde(default)]
    pub default_rate: Option<crate::Rate>,
    /// Each key with running jobs, a limit or rate of its own, or a rate that allows
    /// no start now, by key.
    pub keys: Vec<KeyUse>,
}

impl KeyLimits {
    /// The limit that applies to `key`.
    #[must_use]
    pub fn limit_of(&self, key: &str) -> Option<u32> {
        self.keys
            .iter()
            .find(|k| k.key == key)
            .and_then(|k| k.own)
            .or(self.default)
    }
}

/// One limit key of a queue (SPEC K7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUse {
    /// The key.
    pub key: String,
    /// Its jobs running now (claimed ahead into a buffer included).
    pub running: u64,
    /// Its own limit, when it has one.
    pub own: Option<u32>,
    /// The limit in force: its own, else the queue's default.
    pub limit: Option<u32>,
    /// Its own rate, when it has one (SPEC K12).
    #[serde(default)]
    pub own_rate: Option<crate::Rate>,
    /// The rate in force: its own, else the queue's default key rate.
    #[serde(default)]
    pub rate: Option<crate::Rate>,
    /// When its rate allows its next start, if it allows none now (SPEC K14).
    #[serde(default)]
    pub rate_next: Option<DateTime<Utc>>,
}

/// Keys listed by [`Inspect::key_limits`](crate::Inspect::key_limits) at most.
pub const KEYS_LISTED: usize = 1000;

impl JobInfo {
    /// What the job left on success (SPEC L8): the output of its succeeded attempt.
    #[must_use]
    pub fn result(&self) -> Option<&str> {
        self.attempt_log
            .iter()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Succeeded)
            .and_then(|a| a.output.as_deref())
    }
}

/// A job running now: what, where, since when (SPEC L5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningJob {
    /// The job.
    pub id: JobId,
    /// The worker holding it.
    pub worker: String,
    /// The attempt number.
    pub attempt: u32,
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// When its lease runs out.
    pub lease_expires_at: DateTime<Utc>,
    /// Its progress as last reported (SPEC L7); a report of an earlier attempt until
    /// this one reports.
    #[serde(default)]
    pub progress: Option<Progress>,
}

/// Default retention of finished jobs (SPEC M3).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a maintenance pass did (SPEC C5, M3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Maintenance {
    /// Running jobs whose lease had expired and that were made claimable again.
    pub requeued: u64,
    /// Running jobs whose lease had expired with no attempts left, now dead.
    pub dead: u64,
    /// Finished jobs removed because they were older than the retention.
    pub pruned: u64,
}
