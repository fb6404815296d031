//! # relayq-core
//!
//! The core of relayq, a job queue for ordered parallel work: the types, the backend
//! traits every storage engine implements, the in-memory reference backend and the
//! worker runtime.
//!
//! - **Types**: [`NewJob`] (what to run), [`ClaimedJob`] and its [`Lease`] (the right
//!   to settle one attempt), [`Settle`] outcomes, [`Batch`] and its progress, and the
//!   one [`Error`] type.
//! - **Traits**: [`Enqueue`], [`Claim`], [`Complete`], [`OrderBarrier`], [`Inspect`],
//!   [`Admin`] and [`Events`], summed up by [`Backend`]; all object-safe, so
//!   `Arc<dyn Backend>` works. Each method documents its `# Behavior`, citing the rules
//!   of the contract (`docs/SPEC.md` in the repository) that the conformance suite
//!   (`relayq-conformance`) tests.
//! - **Validation** ([`validate`]) happens here, once, for every backend: each trait's
//!   public methods check their input and call the backend's `*_unchecked` methods.
//! - **[`Driver`]**: what a backend crate tells the rest of relayq about itself (its
//!   URL schemes, how to open it, its test server); `relayq::connect` reads them.
//! - **For adapters**: [`retry::retry_transient`] runs a transaction again after the
//!   server aborted it to resolve a race (a deadlock victim). Methods with a default
//!   body work as they are; a server backend should still override
//!   [`OrderBarrier::reached_unchecked`] with one index look-up, since `wait` asks it at every
//!   check and the default counts the whole batch.
//! - **[`memory::MemoryBackend`]**: the reference model, every rule of the SPEC.
//! - **[`worker::Worker`]**: claims into free slots, heartbeats, settles in batches,
//!   wakes on backend events, shuts down gracefully.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use relayq_core::{memory::MemoryBackend, worker::{JobError, Worker}, *};
//!
//! let backend = Arc::new(MemoryBackend::new());
//! let batch = backend.open_batch("build", OnFailure::Halt).await?;
//! backend
//!     .enqueue(vec![
//!         NewJob::new("build", b"compile a".to_vec()).in_batch(batch.id, 100),
//!         NewJob::new("build", b"compile b".to_vec()).in_batch(batch.id, 100),
//!         NewJob::new("build", b"link".to_vec()).in_batch(batch.id, 200),
//!     ])
//!     .await?;
//! backend.seal(&batch).await?;
//!
//! let worker = Worker::builder(backend.clone(), ["build"])
//!     .concurrency(4)
//!     .handler(|job: ClaimedJob| async move {
//!         // Stage 200 starts only after both stage-100 jobs finished.
//!         let _step = String::from_utf8_lossy(&job.payload);
//!         Ok::<_, JobError>(())
//!     })
//!     .build()?;
//! let running = worker.spawn();
//!
//! let progress = backend.wait(&batch, WaitFor::Batch, Duration::from_secs(10)).await?;
//! assert_eq!(progress.stages.iter().map(|s| s.succeeded).sum::<u64>(), 3);
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

pub mod after;
mod barrier;
mod batch;
mod delegate;
mod drained;
pub mod driver;
mod error;
mod events;
pub mod ext;
mod inspect;
mod job;
pub mod kit;
mod lease;
mod list;
pub mod listing;
pub mod memory;
pub mod progress;
mod queue;
mod rate;
pub mod redact;
pub mod retry;
pub mod schedule;
pub mod settle;
pub mod traced;
mod traits;
pub mod validate;
mod wait_job;
pub mod why;
pub mod worker;
pub mod workers;

pub use after::{After, AfterFailure};
/// The attribute the backend traits are written with, for implementing them.
pub use async_trait::async_trait;
pub use barrier::{POLL_INTERVAL, wait_polling};
pub use batch::{Batch, BatchId, BatchProgress, NewBatch, OnFailure, StageProgress, WaitFor};
pub use drained::wait_drained;
pub use driver::{Driver, Migrate, TestServer};
pub use error::{Error, ErrorKind, Result, SchemaState};
pub use events::{Event, EventBus, EventKind};
pub use ext::{CompleteExt, EnqueueExt, OrderBarrierExt};
pub use inspect::{
    AttemptOutcome, AttemptRecord, DEFAULT_RETENTION, JobInfo, KEYS_LISTED, KeyLimits, KeyUse,
    Maintenance, QueueStats, RunningJob, cancelled_by,
};
pub use job::{DEFAULT_MAX_ATTEMPTS, Enqueued, JobId, JobState, NewJob, RunAt};
pub use lease::{ClaimRequest, Claimed, ClaimedJob, Lease, LeaseToken};
pub use list::{JobFields, JobFilter, JobPage, LIST_SCAN, MAX_FILTER_TEXT};
pub use progress::{Progress, ProgressReport};
pub use queue::QueueUpdate;
pub use rate::Rate;
pub use settle::{DEFAULT_SETTLE_BATCH, Outcome, Retry, Settle, Settled};
pub use traced::Traced;
pub use traits::{
    Admin, Backend, Claim, Complete, Enqueue, Events, Inspect, OrderBarrier, Schedules,
};
pub use validate::Limits;
pub use wait_job::wait_job_polling;
pub use why::{Hold, InspectExt, Why};
pub use workers::{WorkerBeat, WorkerSeen};

/// What [`delegate!`] expands to needs; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use chrono::{DateTime, Utc};
    pub use tokio::sync::broadcast::Receiver;
}
