//! Batches and their ordered stages: the order barrier (SPEC B).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::{AfterFailure, Error, JobState, Result};

/// A batch id, unique within its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BatchId(pub i64);

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A handle to an open batch: its queue and its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Batch {
    /// The queue the batch and all its jobs belong to.
    pub queue: String,
    /// The batch's id within that queue.
    pub id: BatchId,
}

impl From<&Batch> for BatchId {
    fn from(batch: &Batch) -> Self {
        batch.id
    }
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch {} of queue {:?}", self.id, self.queue)
    }
}

/// A batch to open: its queue and its policies (SPEC B1, B6, D4).
///
/// ```
/// use relayq_core::{AfterFailure, NewBatch, OnFailure};
/// let batch = NewBatch::new("etl")
///     .on_failure(OnFailure::Continue)
///     .after_failure(AfterFailure::Run)
///     .name("nightly load");
/// assert_eq!(batch.name.as_deref(), Some("nightly load"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewBatch {
    /// The queue the batch and all its jobs belong to.
    pub queue: String,
    /// What a dead job does to the rest of the batch. Default `Continue`.
    pub on_failure: OnFailure,
    /// What a job does when a job it runs after ends dead or cancelled, unless it says
    /// otherwise (SPEC D4). Default `Cancel`.
    pub after_failure: AfterFailure,
    /// A name people read (1 to 255 bytes, no control characters).
    pub name: Option<String>,
}

impl NewBatch {
    /// A batch of `queue` with every policy at its default.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            on_failure: OnFailure::default(),
            after_failure: AfterFailure::default(),
            name: None,
        }
    }

    /// Sets what a dead job does to the rest of the batch (SPEC B6).
    #[must_use]
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Sets the batch's dependency failure policy (SPEC D4).
    #[must_use]
    pub fn after_failure(mut self, policy: AfterFailure) -> Self {
        self.after_failure = policy;
        self
    }

    /// Sets the batch's name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// What a dead job does to the rest of its batch (SPEC B6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Dead jobs count as finished; later stages still run.
    #[default]
    Continue,
    /// A dead job stops the batch: every other unfinished job is cancelled, running
    /// ones included (their handlers stopped at once), and the batch fails.
    Halt,
}

impl OnFailure {
    /// The lower-case name used in storage and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continue => "continue",
            Self::Halt => "halt",
        }
    }
}

impl FromStr for OnFailure {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "continue" => Ok(Self::Continue),
            "halt" => Ok(Self::Halt),
            _ => Err(Error::invalid(
                "on_failure",
                format!("expected \"continue\" or \"halt\", got {s:?}"),
            )),
        }
    }
}

/// Job counts of one stage (SPEC B5). `pending` covers scheduled, ready, blocked and
/// retrying jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StageProgress {
    /// The stage.
    pub stage: i32,
    /// Not yet started, or waiting to retry.
    pub pending: u64,
    /// Running now.
    pub running: u64,
    /// Succeeded.
    pub succeeded: u64,
    /// Dead.
    pub dead: u64,
    /// Cancelled.
    pub cancelled: u64,
}

impl StageProgress {
    /// Jobs not yet finished.
    #[must_use]
    pub fn unfinished(&self) -> u64 {
        self.pending + self.running
    }

    /// All jobs of the stage.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.unfinished() + self.succeeded + self.dead + self.cancelled
    }

    /// Counts `n` more jobs in `state`.
    pub fn add(&mut self, state: JobState, n: u64) {
        match state {
            JobState::Running => self.running += n,
            JobState::Succeeded => self.succeeded += n,
            JobState::Dead => self.dead += n,
            JobState::Cancelled => self.cancelled += n,
            JobState::Scheduled | JobState::Ready | JobState::Blocked | JobState::Retrying => {
                self.pending += n;
            }
        }
    }

    /// Per-stage progress, in stage order, from `(stage, state, count)` rows as backends
    /// read them.
    pub fn tally(rows: impl IntoIterator<Item = (i32, JobState, u64)>) -> Vec<Self> {
        let mut stages: std::collections::BTreeMap<i32, Self> = std::collections::BTreeMap::new();
        for (stage, state, n) in rows {
            stages
                .entry(stage)
                .or_insert(Self {
                    stage,
                    ..Self::default()
                })
                .add(state, n);
        }
        stages.into_values().collect()
    }
}

/// Progress of a batch (SPEC B5, M1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchProgress {
    /// The batch.
    pub batch: Batch,
    /// Its failure policy.
    pub on_failure: OnFailure,
    /// What its jobs do when a job they run after fails, unless they say otherwise
    /// (SPEC D4).
    #[serde(default)]
    pub after_failure: AfterFailure,
    /// Whether it is sealed (no more jobs).
    pub sealed: bool,
    /// Whether a `Halt` batch saw a dead job.
    pub failed: bool,
    /// The highest stage released so far, if any job was added.
    pub released_stage: Option<i32>,
    /// Counts per stage, ascending by stage.
    pub stages: Vec<StageProgress>,
    /// The name it was opened with, if any.
    #[serde(default)]
    pub name: Option<String>,
    /// When it was opened (server time).
    #[serde(default)]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the last of its jobs to finish so far finished, if one did: once the batch
    /// is done, its end, so its duration is this less `created_at`.
    #[serde(default)]
    pub last_finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl BatchProgress {
    /// Whether every job of `stage` and of all stages below it is finished.
    #[must_use]
    pub fn stage_finished(&self, stage: i32) -> bool {
        self.stages
            .iter()
            .filter(|s| s.stage <= stage)
            .all(|s| s.unfinished() == 0)
    }

    /// Whether the batch is sealed and all its jobs are finished.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.sealed && self.stages.iter().all(|s| s.unfinished() == 0)
    }

    /// Whether `target` is reached.
    #[must_use]
    pub fn reached(&self, target: WaitFor) -> bool {
        match target {
            WaitFor::Stage(s) => self.stage_finished(s),
            WaitFor::Batch => self.is_finished(),
        }
    }
}

/// What [`OrderBarrier::wait`](crate::OrderBarrier::wait) waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// Every job of this stage and of all lower stages is finished.
    Stage(i32),
    /// The batch is sealed and every job in it is finished.
    Batch,
}

impl WaitFor {
    /// Whether the target is reached, given whether the batch is sealed and its lowest
    /// stage with an unfinished job: what a backend's
    /// [`reached`](crate::OrderBarrier::reached) decides from one index look-up.
    #[must_use]
    pub fn reached_at(self, sealed: bool, lowest_unfinished: Option<i32>) -> bool {
        match (self, lowest_unfinished) {
            (Self::Stage(s), Some(low)) => low > s,
            (Self::Stage(_), None) => true,
            (Self::Batch, low) => sealed && low.is_none(),
        }
    }
}
