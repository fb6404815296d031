//! `use relayq::prelude::*;`: the backend traits and their extensions (so methods on `Arc<dyn Backend>`
//! resolve), the job and batch types, errors, the worker, and `chrono`'s time types
//! that [`NewJob::run_at`](relayq_core::NewJob::run_at) and
//! [`Retry::At`](relayq_core::Retry::At) take.

pub use chrono::{DateTime, Utc};
pub use relayq_core::{
    Admin, Backend, Batch, BatchId, BatchProgress, Claim, ClaimRequest, ClaimedJob, Complete,
    CompleteExt, Enqueue, EnqueueExt, Enqueued, Error, ErrorKind, Events, Inspect, InspectExt,
    JobId, JobState, Lease, NewJob, OnFailure, OrderBarrier, OrderBarrierExt, QueueStats, Result,
    Retry, Schedules, Settle, Settled, WaitFor, wait_drained,
    worker::{JobError, Worker},
};
pub use std::sync::Arc;
