//! The in-memory backend: the reference model of the SPEC.
//!
//! Every rule (E, C, L, G, B, M) is implemented as plainly as possible over one mutex,
//! so that other backends can be compared with it. State lives only in this process;
//! clones of a [`MemoryBackend`] share it (they are separate "handles" to one store, the
//! way several connections share one database).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use std::time::Duration;
//! use relayq_core::{memory::MemoryBackend, Claim, ClaimRequest, CompleteExt, EnqueueExt, NewJob};
//!
//! let backend = MemoryBackend::new();
//! backend.enqueue_one(NewJob::new("mail", b"hi".to_vec())).await?;
//! let jobs = backend.claim(ClaimRequest::new("mail", "worker-1", 10, Duration::from_secs(30))).await?;
//! backend.complete(&jobs[0].lease).await?;
//! # Ok(()) }
//! ```

mod clock;
mod schedules;
mod store;
mod view;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::broadcast;

pub use clock::{Clock, ManualClock, SystemClock};
use store::QueueState;

use crate::{
    Admin, Batch, BatchProgress, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Enqueued,
    Event, EventBus, EventKind, Events, Inspect, JobId, JobInfo, Lease, Limits, Maintenance,
    NewBatch, NewJob, OrderBarrier, ProgressReport, QueueStats, QueueUpdate, Result, RunningJob,
    Settle, Settled,
};

/// The in-memory reference backend. Cheap to clone; clones share one store.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queues: Mutex<HashMap<String, QueueState>>,
    clock: Arc<dyn Clock>,
    limits: Limits,
    events: EventBus,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A backend on the system clock with default limits.
    #[must_use]
    pub fn new() -> Self {
        Self::with(Arc::new(SystemClock), Limits::default())
    }

    /// A backend on `clock` with `limits`.
    #[must_use]
    pub fn with(clock: Arc<dyn Clock>, limits: Limits) -> Self {
        Self {
            inner: Arc::new(Inner {
                queues: Mutex::new(HashMap::new()),
                clock,
                limits,
                events: EventBus::new(),
            }),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, QueueState>> {
        // A panic while holding the lock cannot leave a half-applied change: every
        // mutation checks before it writes. So a poisoned lock is still usable.
        self.inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the queue's state, creating it on first use.
    fn with_queue<T>(
        &self,
        queue: &str,
        f: impl FnOnce(&mut QueueState, DateTime<Utc>) -> T,
    ) -> Result<T> {
        // Read the clock once the lock is held: a call that waited for the lock must
        // not be stamped with the time it started waiting.
        let mut queues = self.lock();
        let now = self.now();
        let q = queues.entry(queue.to_owned()).or_default();
        let out = f(q, now);
        // A job that died in `f` (a settle, an expiry) may have halted its batch and
        // cancelled running jobs: their workers hear of it now (SPEC B8).
        let revoked = std::mem::take(&mut q.revoked);
        drop(queues);
        if revoked {
            self.notify(queue, EventKind::Revoked);
        }
        Ok(out)
    }

    fn notify(&self, queue: &str, kind: EventKind) {
        self.inner.events.notify(queue, kind);
    }
}

impl Events for MemoryBackend {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        Some(self.inner.events.subscribe())
    }

    /// One process holds the store, and every cancel notifies its bus.
    fn pushes_revocations(&self) -> bool {
        true
    }
}

#[async_trait]
impl Enqueue for MemoryBackend {
    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let Some(queue) = jobs.first().map(|j| j.queue.clone()) else {
            return Ok(Vec::new());
        };
        let out = self.with_queue(&queue, |q, now| q.enqueue(jobs, now))??;
        self.notify(&queue, EventKind::Ready);
        Ok(out)
    }

    fn limits(&self) -> Limits {
        // Limit keys are enforced here (SPEC K), whatever the configuration says.
        Limits {
            limit_keys: true,
            dependencies: true,
            rates: true,
            ..self.inner.limits
        }
    }
}

#[async_trait]
impl Claim for MemoryBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<crate::Claimed> {
        self.with_queue(&req.queue, |q, now| q.claim(&req.queue, &req, now))
    }
}

#[async_trait]
impl Complete for MemoryBackend {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        let mut queues = self.lock();
        let now = self.now();
        let mut finished = Vec::new();
        let out = settles
            .into_iter()
            .map(|s| {
                let queue = s.lease.queue.clone();
                let res = queues.entry(queue.clone()).or_default().settle(s, now);
                if res.is_ok() {
                    finished.push(queue);
                }
                res
            })
            .collect();
        finished.sort_unstable();
        finished.dedup();
        // A dead job may have halted its batch, cancelling running jobs (SPEC B6, B8).
        let revoked: Vec<String> = finished
            .iter()
            .filter(|q| {
                queues
                    .get_mut(*q)
                    .is_some_and(|s| std::mem::take(&mut s.revoked))
            })
            .cloned()
            .collect();
        drop(queues);
        for queue in revoked {
            self.notify(&queue, EventKind::Revoked);
        }
        for queue in finished {
            self.notify(&queue, EventKind::Finished);
            self.notify(&queue, EventKind::Ready);
        }
        Ok(out)
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        self.with_queue(&lease.queue, |q, now| {
            let until = now + TimeDelta::from_std(extend).unwrap_or(TimeDelta::MAX);
            q.heartbeat(lease, until, now)
        })?
    }

    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let queues = self.lock();
        let mut lost: Vec<JobId> = leases
            .iter()
            .filter(|l| queues.get(&l.queue).is_none_or(|q| q.lease_lost(l)))
            .map(|l| l.job)
            .collect();
        lost.sort_unstable();
        lost.dedup();
        Ok(lost)
    }

    async fn worker_beat_unchecked(&self, queue: &str, beat: &crate::WorkerBeat) -> Result<()> {
        self.with_queue(queue, |q, now| q.worker_beat(beat, now))
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let mut queues = self.lock();
        Ok(reports
            .iter()
            .filter(|r| {
                !queues
                    .get_mut(&r.lease.queue)
                    .is_some_and(|q| q.report_progress(r))
            })
            .map(|r| r.lease.job)
            .collect())
    }
}

#[async_trait]
impl OrderBarrier for MemoryBackend {
    async fn open_batch_unchecked(&self, batch: &NewBatch) -> Result<Batch> {
        let id = self.with_queue(&batch.queue, |q, now| q.open_batch(batch, now))?;
        Ok(Batch {
            queue: batch.queue.clone(),
            id,
        })
    }

    async fn seal_unchecked(&self, batch: &Batch) -> Result<()> {
        self.with_queue(&batch.queue, |q, _| q.seal(batch.id, &batch.queue))??;
        self.notify(&batch.queue, EventKind::Finished);
        Ok(())
    }

    async fn batch_progress_unchecked(&self, batch: &Batch) -> Result<BatchProgress> {
        self.with_queue(&batch.queue, |q, now| q.batch_progress(batch, now))?
    }
}

#[async_trait]
impl Inspect for MemoryBackend {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        self.with_queue(queue, |q, now| q.stats(queue, now))
    }

    async fn key_limits_unchecked(&self, queue: &str) -> Result<crate::KeyLimits> {
        self.with_queue(queue, |q, now| q.key_limits(now))
    }

    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        self.with_queue(queue, |q, now| q.job_info(id, queue, now))?
    }

    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        self.with_queue(queue, |q, _| q.running())
    }

    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        Ok(self.lock().get(queue).and_then(|q| q.group_holder(group)))
    }

    async fn batches_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        self.with_queue(queue, |q, now| q.batches(queue, limit as usize, now))?
    }

    async fn batch_jobs_unchecked(
        &self,
        batch: &Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        self.with_queue(&batch.queue, |q, _| {
            q.batch_jobs(batch, after, limit as usize)
        })?
    }

    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<crate::WorkerSeen>> {
        self.with_queue(queue, |q, now| q.workers(now))
    }

    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &crate::JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<crate::JobPage> {
        self.with_queue(queue, |q, now| q.list_jobs(filter, before, limit, now))
    }

    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        self.with_queue(queue, |q, now| q.dead_jobs(queue, limit as usize, now))
    }

    async fn queues(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, q)| q.in_use())
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        Ok(names)
    }
}

#[async_trait]
impl Admin for MemoryBackend {
    async fn update_queue_unchecked(&self, queue: &str, update: QueueUpdate) -> Result<()> {
        self.with_queue(queue, |q, _| {
            if let Some(paused) = update.paused {
                q.paused = paused;
            }
            if let Some(max) = update.max_running {
                q.max_running = max;
            }
            // A new rate starts afresh: its first burst may start at once; the same
            // rate set again keeps its state (SPEC K8).
            if let Some(rate) = update.rate
                && rate != q.rate
            {
                q.rate = rate;
                q.rate_tat = None;
            }
        })?;
        if update.may_free_claims() {
            self.notify(queue, EventKind::Ready);
        }
        Ok(())
    }

    async fn set_key_limit_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        self.with_queue(queue, |q, _| match (key, limit) {
            (None, limit) => q.key_default = limit,
            (Some(k), Some(n)) => {
                q.key_own.insert(k.to_owned(), n);
            }
            (Some(k), None) => {
                q.key_own.remove(k);
            }
        })?;
        self.notify(queue, EventKind::Ready);
        Ok(())
    }

    async fn set_key_rate_unchecked(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<crate::Rate>,
    ) -> Result<()> {
        self.with_queue(queue, |q, _| q.set_key_rate(key, rate))?;
        self.notify(queue, EventKind::Ready);
        Ok(())
    }

    async fn cancel_job_unchecked(&self, queue: &str, id: JobId) -> Result<bool> {
        let changed = self.with_queue(queue, |q, now| {
            q.cancel_job(id, queue, now, crate::cancelled_by::JOB)
        })??;
        if changed {
            self.notify(queue, EventKind::Revoked);
            self.notify(queue, EventKind::Finished);
            self.notify(queue, EventKind::Ready);
        }
        Ok(changed)
    }

    async fn cancel_batch_unchecked(&self, batch: &Batch) -> Result<u64> {
        let n = self.with_queue(&batch.queue, |q, now| {
            q.cancel_batch(batch, now, crate::cancelled_by::BATCH)
        })??;
        // Cancelling may hand a group to a job outside the batch.
        if n > 0 {
            self.notify(&batch.queue, EventKind::Revoked);
        }
        self.notify(&batch.queue, EventKind::Finished);
        self.notify(&batch.queue, EventKind::Ready);
        Ok(n)
    }

    async fn purge_unchecked(&self, queue: &str) -> Result<u64> {
        let n = self.with_queue(queue, |q, now| q.purge(queue, now))??;
        if n > 0 {
            self.notify(queue, EventKind::Revoked);
            self.notify(queue, EventKind::Finished);
        }
        Ok(n)
    }

    async fn run_now_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        let n = self.with_queue(queue, |q, now| q.run_now(ids, now))?;
        self.notify(queue, EventKind::Ready);
        Ok(n)
    }

    async fn delete_jobs_unchecked(&self, queue: &str, ids: &[JobId]) -> Result<u64> {
        self.with_queue(queue, |q, _| q.delete_jobs(ids))
    }

    async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        let n = self.with_queue(queue, |q, now| q.retry_dead(ids, now))?;
        self.notify(queue, EventKind::Ready);
        Ok(n)
    }

    async fn maintain_unchecked(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        let report = self.with_queue(queue, |q, now| {
            let (requeued, dead) = q.expire_leases(now);
            let cutoff = TimeDelta::from_std(retention)
                .ok()
                .and_then(|r| now.checked_sub_signed(r))
                .unwrap_or(DateTime::<Utc>::MIN_UTC);
            Maintenance {
                requeued,
                dead,
                pruned: q.prune(cutoff),
            }
        })?;
        if report.requeued + report.dead > 0 {
            self.notify(queue, EventKind::Finished);
            self.notify(queue, EventKind::Ready);
        }
        Ok(report)
    }
}

/// The in-memory backend's [`Driver`](crate::Driver): `memory://`, a new empty store at
/// every open.
pub static DRIVER: crate::Driver = crate::Driver {
    name: "memory",
    schemes: &["memory"],
    feature: "",
    example_url: "memory://",
    open: |_, _| Box::pin(async { Ok(Arc::new(MemoryBackend::new()) as Arc<dyn crate::Backend>) }),
    server: None,
};
