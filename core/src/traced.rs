//! [`Traced`]: a backend whose enqueues, claims, settles and heartbeats each run in a
//! `tracing` span, with the queue, the job ids and the attempt. A worker wraps its
//! backend in one; wrap yours to trace what your program enqueues, but give the worker
//! the unwrapped backend, or its claims and settles are traced twice.
//!
//! | span | fields |
//! |---|---|
//! | `relayq.enqueue` | `queue`, `jobs`, `first_id` (set when stored) |
//! | `relayq.claim` | `queue`, `worker`, `limit`, `claimed` |
//! | `relayq.settle` | `queue` (of the first lease), `leases`, `first_id`, `attempt` |
//! | `relayq.heartbeat` (debug) | `queue`, `id`, `attempt` |
//! | `relayq.job` (the worker, per handler run) | `queue`, `id`, `attempt` |
//!
//! With no subscriber, or one that filters these out, a span costs a check of an atomic
//! per call. Every other call passes through untouched (see [`delegate!`](crate::delegate)).

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use tracing::{Instrument, field::Empty};

use crate::{
    Backend, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Enqueued, JobId, Lease, Limits,
    NewJob, ProgressReport, Result, Settle, Settled, async_trait,
};

/// A backend whose calls run in spans (see the [module](self)).
pub struct Traced {
    inner: Arc<dyn Backend>,
}

impl Traced {
    /// `inner`, traced.
    #[must_use]
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self { inner }
    }
}

crate::delegate!(Traced, inner => Events, OrderBarrier, Inspect, Admin, Schedules);

// Input is checked by the public methods before these run, so a rejected call opens no
// span.

#[async_trait]
impl Enqueue for Traced {
    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let queue = jobs.first().map_or("", |j| j.queue.as_str()).to_owned();
        let span =
            tracing::info_span!("relayq.enqueue", queue, jobs = jobs.len(), first_id = Empty);
        let out = self
            .inner
            .enqueue_unchecked(jobs)
            .instrument(span.clone())
            .await;
        if let Some(first) = out.as_ref().ok().and_then(|ids| ids.first()) {
            span.record("first_id", first.id.0);
        }
        out
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }
}

#[async_trait]
impl Claim for Traced {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<crate::Claimed> {
        let span = tracing::info_span!(
            "relayq.claim",
            queue = %req.queue,
            worker = %req.worker,
            limit = req.limit,
            claimed = Empty
        );
        let out = self
            .inner
            .claim_paced_unchecked(req)
            .instrument(span.clone())
            .await;
        if let Ok(got) = &out {
            span.record("claimed", got.jobs.len());
        }
        out
    }
}

#[async_trait]
impl Complete for Traced {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        let first = settles.first().map(|s| &s.lease);
        let span = tracing::info_span!(
            "relayq.settle",
            queue = first.map_or("", |l| l.queue.as_str()),
            leases = settles.len(),
            first_id = first.map(|l| l.job.0),
            attempt = first.map(|l| l.attempt),
        );
        self.inner
            .settle_many_unchecked(settles)
            .instrument(span)
            .await
    }

    fn preferred_settle_batch(&self) -> usize {
        self.inner.preferred_settle_batch()
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        let span = tracing::debug_span!(
            "relayq.heartbeat",
            queue = %lease.queue,
            id = lease.job.0,
            attempt = lease.attempt
        );
        self.inner
            .heartbeat_unchecked(lease, extend)
            .instrument(span)
            .await
    }

    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let span = tracing::debug_span!("relayq.lost_leases", leases = leases.len());
        self.inner
            .lost_leases_unchecked(leases)
            .instrument(span)
            .await
    }

    async fn worker_beat_unchecked(&self, queue: &str, beat: &crate::WorkerBeat) -> Result<()> {
        self.inner.worker_beat_unchecked(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let span = tracing::debug_span!("relayq.report_progress", reports = reports.len());
        self.inner
            .report_progress_unchecked(reports)
            .instrument(span)
            .await
    }
}
