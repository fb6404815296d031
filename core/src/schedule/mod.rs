//! Schedules (SPEC S): recurring jobs or staged batches, one enqueue per slot, with no
//! leader.
//!
//! A schedule is stored in the backend with a *mark*: the last slot it handled. Any
//! number of schedulers (every [`Worker`](crate::worker::Worker) runs one) read the
//! marks, work out which slot is due from the server's time, and ask the backend to
//! [`fire`](crate::Schedules::fire_unchecked) it: the backend moves the mark forward
//! and stores the slot's jobs in one atomic unit (a transaction, a script), and only if
//! the mark was still behind the slot. Of any number of schedulers one wins each slot;
//! a crash between the two writes is impossible, and pruning finished jobs cannot bring
//! a slot back.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use relayq_core::{memory::MemoryBackend, schedule::Schedule, NewJob, Schedules};
//!
//! let backend = MemoryBackend::new();
//! let nightly = Schedule::new("reports", "nightly", "0 2 * * *")
//!     .time_zone("Europe/Berlin")
//!     .job(NewJob::new("reports", b"build the report".to_vec()));
//! backend.put_schedule(&nightly).await?;
//! let listed = backend.schedules("reports").await?;
//! assert!(listed[0].next_slot.is_some());
//! # Ok(()) }
//! ```

pub(crate) mod check;
mod due;
mod run;
mod timetable;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use due::ON_TIME;
pub use run::{Memo, Tick, run_due, run_due_with};
pub(crate) use run::{decode, run_now};
pub use timetable::Timetable;

use crate::{BatchId, Enqueued, JobId, NewJob, OnFailure};

/// Longest schedule name, in bytes.
pub const MAX_NAME: usize = 128;
/// Most jobs one slot may enqueue.
pub const MAX_SLOT_JOBS: usize = 1000;
/// Largest definition a backend stores, as JSON: every worker reads it about once a
/// second.
pub const MAX_DEFINITION: usize = 4 * 1024 * 1024;
/// Longest catch-up window of [`Missed::All`]: 366 days.
pub const MAX_CATCH_UP: Duration = Duration::from_secs(366 * 24 * 3600);

/// What to do with slots that passed while no scheduler ran (SPEC S3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Missed {
    /// Run no missed slot: a slot found more than [`ON_TIME`] after its time is passed
    /// over, and the next one runs.
    Skip,
    /// Run the most recent missed slot once; older ones are passed over. The default.
    #[default]
    Latest,
    /// Run every missed slot of the last `within_secs` seconds, oldest first; older
    /// ones are passed over. At most [`MAX_CATCH_UP`].
    All {
        /// The catch-up window, in seconds.
        within_secs: u64,
    },
}

impl Missed {
    /// [`Missed::All`] within `window`.
    #[must_use]
    pub fn all_within(window: Duration) -> Self {
        Self::All {
            within_secs: window.as_secs(),
        }
    }
}

/// One job a slot enqueues: a [`NewJob`] without queue, batch or time, which the slot
/// gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SlotJob {
    /// The payload (base64 in the stored definition).
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    /// Lower runs first.
    pub priority: i16,
    /// 1..=1000.
    pub max_attempts: u16,
    /// Its group (SPEC G).
    pub group: Option<String>,
    /// Its stage, when the slot makes a batch (SPEC B).
    pub stage: Option<i32>,
    /// Its dedupe key (SPEC E3): a slot whose job still holds the key makes none.
    pub dedupe_key: Option<String>,
}

impl SlotJob {
    /// The job a slot of schedule `name` enqueues into `queue`. With `in_batch` it keeps
    /// its stage (0 when unset) and the backend puts it in the batch the slot opens.
    #[must_use]
    pub fn to_new_job(&self, queue: &str, name: &str, in_batch: bool) -> NewJob {
        let mut job = NewJob::new(queue, self.payload.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts);
        job.group.clone_from(&self.group);
        job.dedupe_key.clone_from(&self.dedupe_key);
        job.stage = in_batch.then(|| self.stage.unwrap_or(0));
        job.enqueued_by = Some(format!("schedule {name}"));
        job
    }
}

impl From<NewJob> for SlotJob {
    /// Keeps what a slot's job can carry: the queue, batch and time are the slot's.
    fn from(job: NewJob) -> Self {
        Self {
            payload: job.payload,
            priority: job.priority,
            max_attempts: job.max_attempts,
            group: job.group,
            stage: job.stage,
            dedupe_key: job.dedupe_key,
        }
    }
}

/// A schedule: when (a cron expression in a time zone) and what (jobs, or a staged
/// batch) (SPEC S1). Build it with [`Schedule::new`] and the chained setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Schedule {
    /// The queue its jobs go to; the name is unique within it.
    pub queue: String,
    /// 1 to 128 bytes, no control characters.
    pub name: String,
    /// What a stored schedule does each slot.
    pub definition: Definition,
    /// Slots at or before this instant never run. Only read when the schedule is
    /// first stored: by default the server's time then, so no past slot runs.
    pub starting: Option<DateTime<Utc>>,
}

/// The part of a [`Schedule`] that a replacement replaces (SPEC S1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Definition {
    /// Five fields, or six with seconds first (croner's syntax).
    pub cron: String,
    /// IANA name; default `UTC`.
    pub time_zone: String,
    /// The missed-slot policy.
    pub missed: Missed,
    /// The jobs each slot enqueues (at least one).
    pub jobs: Vec<SlotJob>,
    /// When set, each slot opens a batch with this policy, puts the jobs in at their
    /// stages and seals it.
    pub batch: Option<OnFailure>,
}

impl Schedule {
    /// A schedule named `name` in `queue` firing on `cron`, in UTC, with
    /// [`Missed::Latest`] and no jobs yet.
    pub fn new(queue: impl Into<String>, name: impl Into<String>, cron: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            name: name.into(),
            definition: Definition {
                cron: cron.into(),
                time_zone: "UTC".to_owned(),
                missed: Missed::Latest,
                jobs: Vec::new(),
                batch: None,
            },
            starting: None,
        }
    }

    /// Reads the cron expression in this IANA time zone.
    #[must_use]
    pub fn time_zone(mut self, tz: impl Into<String>) -> Self {
        self.definition.time_zone = tz.into();
        self
    }

    /// Sets the missed-slot policy.
    #[must_use]
    pub fn missed(mut self, missed: Missed) -> Self {
        self.definition.missed = missed;
        self
    }

    /// Adds a job each slot enqueues (its queue, batch and time are ignored).
    #[must_use]
    pub fn job(mut self, job: NewJob) -> Self {
        self.definition.jobs.push(job.into());
        self
    }

    /// Makes each slot a staged batch: a new batch with `on_failure`, holding every
    /// job at its [`stage`](NewJob::stage), sealed.
    #[must_use]
    pub fn batch(mut self, on_failure: OnFailure) -> Self {
        self.definition.batch = Some(on_failure);
        self
    }

    /// Never runs slots at or before `at`, and none before it is first stored.
    #[must_use]
    pub fn starting(mut self, at: DateTime<Utc>) -> Self {
        self.starting = Some(at);
        self
    }
}

/// A schedule as a backend stores it: the definition as JSON text, which only core
/// reads, and the state schedulers share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    /// Its name.
    pub name: String,
    /// [`Definition`] as JSON.
    pub definition: String,
    /// Raised by each replacement, so a scheduler that read an older definition
    /// cannot fire it.
    pub version: i64,
    /// The last slot handled (fired or passed over).
    pub mark: DateTime<Utc>,
    /// Paused schedules fire nothing.
    pub paused: bool,
    /// The last slot fired, and what it made.
    pub last_slot: Option<DateTime<Utc>>,
    /// The first job the last fired slot stored (none when all were deduplicated).
    pub last_job: Option<JobId>,
    /// The batch the last fired slot made.
    pub last_batch: Option<BatchId>,
}

/// A schedule as [`Schedules::schedules`](crate::Schedules::schedules) lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its queue.
    pub queue: String,
    /// Its name.
    pub name: String,
    /// What it does; `None` when the stored text does not read as a definition (one
    /// written by a newer relayq).
    pub definition: Option<Definition>,
    /// Its version, raised by each replacement.
    pub version: i64,
    /// Whether it is paused.
    pub paused: bool,
    /// The last slot handled.
    pub mark: DateTime<Utc>,
    /// The last slot fired.
    pub last_slot: Option<DateTime<Utc>>,
    /// The first job the last fired slot stored.
    pub last_job: Option<JobId>,
    /// The batch the last fired slot made.
    pub last_batch: Option<BatchId>,
    /// The next slot that will run, by the server's clock (`None`: paused, or never).
    pub next_slot: Option<DateTime<Utc>>,
}

/// One slot to fire, as core asks a backend (SPEC S2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The schedule's queue; every job is of it.
    pub queue: String,
    /// The schedule's name.
    pub name: String,
    /// The version whose definition made `jobs`.
    pub version: i64,
    /// The slot; `None` for "run now", which moves no mark and ignores the pause.
    pub slot: Option<DateTime<Utc>>,
    /// The jobs, valid per [`validate::new_jobs`](crate::validate::new_jobs) except
    /// that, when `batch` is set, each has a stage and no batch yet; empty to pass over
    /// the slots up to `slot`.
    pub jobs: Vec<NewJob>,
    /// When set, the backend opens a batch with this policy, puts the jobs in it at
    /// their stages and seals it, all in the same atomic unit.
    pub batch: Option<crate::OnFailure>,
}

/// What a backend did with a [`Fire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// The mark moved to the slot and these were stored, atomically.
    Made {
        /// The batch made, if the slot makes one.
        batch: Option<BatchId>,
        /// One per job asked, in order.
        jobs: Vec<Enqueued>,
    },
    /// The mark is at or past the slot: another scheduler fired it.
    Taken,
    /// Another scheduler holds the schedule right now (a row lock); try again later.
    Busy,
    /// The schedule's version is no longer the one asked.
    Changed,
    /// The schedule is paused.
    Paused,
    /// No such schedule.
    Gone,
    /// The slot lies after the server's time.
    NotDue,
}

impl Fired {
    /// The batch made, or the first job stored.
    #[must_use]
    pub fn made(&self) -> Option<(Option<BatchId>, Option<JobId>)> {
        match self {
            Self::Made { batch, jobs } => {
                Some((*batch, jobs.iter().find(|e| !e.deduplicated).map(|e| e.id)))
            }
            _ => None,
        }
    }
}

/// Bytes as standard base64 text in JSON, a third larger than the bytes rather than
/// four times as an array of numbers.
mod base64_bytes {
    use base64::{Engine, engine::general_purpose::STANDARD};
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(D::Error::custom)
    }
}
