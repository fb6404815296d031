//! Claims and the leases they hand out (SPEC C, L).

use std::{fmt, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{BatchId, JobId};

/// A random 128-bit token fencing one claim of one job (SPEC C1, L1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseToken(pub Uuid);

impl LeaseToken {
    /// A fresh random token.
    #[must_use]
    pub fn random() -> Self {
        Self(Uuid::new_v4())
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A request to claim up to `limit` jobs of `queue` for `worker` (SPEC C1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The queue to claim from.
    pub queue: String,
    /// Who claims: recorded in the execution log (SPEC L5).
    pub worker: String,
    /// 1..=1000.
    pub limit: u32,
    /// How long the lease lasts before another claimer may take the job over.
    pub lease: Duration,
    /// How many of the claimed jobs start at once; the rest are claimed ahead (SPEC K6,
    /// W1). At least `limit` means all of them.
    pub slots: u32,
}

impl ClaimRequest {
    /// A claim of up to `limit` jobs of `queue` by `worker`, leased for `lease`.
    pub fn new(
        queue: impl Into<String>,
        worker: impl Into<String>,
        limit: u32,
        lease: Duration,
    ) -> Self {
        Self {
            queue: queue.into(),
            worker: worker.into(),
            limit,
            lease,
            slots: limit,
        }
    }

    /// Says that only the first `slots` jobs start at once and the rest are held ahead
    /// (SPEC K6).
    #[must_use]
    pub fn with_slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }
}

/// What [`Claim::claim_paced`](crate::Claim::claim_paced) returns: the jobs, and how
/// long until the queue's rate lets the next one start when the rate cut the claim
/// short (SPEC K10).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Claimed {
    /// The jobs claimed, as [`Claim::claim`](crate::Claim::claim) returns them.
    pub jobs: Vec<ClaimedJob>,
    /// `Some` when the queue's rate gave fewer jobs than the claim could otherwise
    /// have taken: the wait until it allows the next start, on the server's clock.
    pub next_in: Option<Duration>,
    /// `Some` when the rate of a limit key held one of the queue's jobs back: the wait
    /// until the earliest such key allows its next start (SPEC K13). Other jobs may
    /// start sooner; a worker claims again by then at the latest.
    pub wake_in: Option<Duration>,
}

impl Claimed {
    /// Jobs, and the wait the rate named when it cut the claim short.
    #[must_use]
    pub fn new(jobs: Vec<ClaimedJob>, next_in: Option<Duration>) -> Self {
        Self {
            jobs,
            next_in,
            wake_in: None,
        }
    }

    /// The same, saying when a key's rate allows its next start.
    #[must_use]
    pub fn waking_in(mut self, wake_in: Option<Duration>) -> Self {
        self.wake_in = wake_in;
        self
    }

    /// Jobs that no rate cut short.
    #[must_use]
    pub fn jobs(jobs: Vec<ClaimedJob>) -> Self {
        Self {
            jobs,
            next_in: None,
            wake_in: None,
        }
    }
}

/// The right to settle one attempt of one job. Hand it back to complete, fail, heartbeat
/// or release the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The job's queue.
    pub queue: String,
    /// The job.
    pub job: JobId,
    /// The token that fences this attempt.
    pub token: LeaseToken,
    /// The attempt number, 1 on first claim.
    pub attempt: u32,
    /// When the lease runs out unless heartbeated (server time).
    pub expires_at: DateTime<Utc>,
    /// The worker that holds it.
    pub worker: String,
}

/// A job handed to a worker by a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedJob {
    /// The lease under which the job runs.
    pub lease: Lease,
    /// The job's payload.
    pub payload: Vec<u8>,
    /// Its priority.
    pub priority: i16,
    /// When it was due (its order-key time).
    pub run_at: DateTime<Utc>,
    /// How many attempts it gets in all.
    pub max_attempts: u16,
    /// Its group, if any.
    pub group: Option<String>,
    /// Its batch, if any.
    pub batch: Option<BatchId>,
    /// Its stage, if in a batch.
    pub stage: Option<i32>,
    /// Who enqueued it.
    pub enqueued_by: Option<String>,
}

impl ClaimedJob {
    /// The job's id.
    #[must_use]
    pub fn id(&self) -> JobId {
        self.lease.job
    }

    /// The attempt number (1 on first claim).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    /// Deserializes the payload as JSON.
    ///
    /// # Errors
    /// The JSON error when the payload is not a `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.payload)
    }
}
