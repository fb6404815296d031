//! A backend that times its claims, for the phase scenario: every other call passes
//! through untouched.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    Admin, Backend, Batch, BatchProgress, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue,
    Enqueued, Event, Events, Inspect, JobId, JobInfo, Lease, Maintenance, NewJob, OnFailure,
    OrderBarrier, QueueStats, Result, RunningJob, Settle, Settled, WaitFor,
};
use tokio::sync::broadcast;

pub struct Timed {
    inner: Arc<dyn Backend>,
    claims: Mutex<Vec<Duration>>,
}

impl Timed {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            claims: Mutex::new(Vec::new()),
        }
    }

    /// The claim times since the last call.
    pub fn take(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.claims.lock().expect("not poisoned"))
    }
}

impl Events for Timed {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        self.inner.subscribe()
    }
}

#[async_trait]
impl Claim for Timed {
    async fn claim(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let start = Instant::now();
        let out = self.inner.claim(req).await;
        self.claims
            .lock()
            .expect("not poisoned")
            .push(start.elapsed());
        out
    }
}

#[async_trait]
impl Enqueue for Timed {
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.inner.enqueue(jobs).await
    }
}

#[async_trait]
impl Complete for Timed {
    async fn settle_many(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        self.inner.settle_many(settles).await
    }
    fn preferred_settle_batch(&self) -> usize {
        self.inner.preferred_settle_batch()
    }
    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        self.inner.heartbeat(lease, extend).await
    }
}

#[async_trait]
impl OrderBarrier for Timed {
    async fn open_batch(&self, queue: &str, on_failure: OnFailure) -> Result<Batch> {
        self.inner.open_batch(queue, on_failure).await
    }
    async fn seal(&self, batch: &Batch) -> Result<()> {
        self.inner.seal(batch).await
    }
    async fn batch_progress(&self, batch: &Batch) -> Result<BatchProgress> {
        self.inner.batch_progress(batch).await
    }
    async fn reached(&self, batch: &Batch, target: WaitFor) -> Result<bool> {
        self.inner.reached(batch, target).await
    }
}

#[async_trait]
impl Inspect for Timed {
    async fn queue_stats(&self, queue: &str) -> Result<QueueStats> {
        self.inner.queue_stats(queue).await
    }
    async fn job(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        self.inner.job(queue, id).await
    }
    async fn running(&self, queue: &str) -> Result<Vec<RunningJob>> {
        self.inner.running(queue).await
    }
    async fn batches(&self, queue: &str, limit: u32) -> Result<Vec<BatchProgress>> {
        self.inner.batches(queue, limit).await
    }
    async fn dead_jobs(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        self.inner.dead_jobs(queue, limit).await
    }

    async fn queues(&self) -> Result<Vec<String>> {
        self.inner.queues().await
    }
}

#[async_trait]
impl Admin for Timed {
    async fn pause(&self, queue: &str) -> Result<()> {
        self.inner.pause(queue).await
    }
    async fn resume(&self, queue: &str) -> Result<()> {
        self.inner.resume(queue).await
    }
    async fn set_max_running(&self, queue: &str, max_running: Option<u32>) -> Result<()> {
        self.inner.set_max_running(queue, max_running).await
    }
    async fn cancel_job(&self, queue: &str, id: JobId) -> Result<bool> {
        self.inner.cancel_job(queue, id).await
    }
    async fn cancel_batch(&self, batch: &Batch) -> Result<u64> {
        self.inner.cancel_batch(batch).await
    }
    async fn retry_dead(&self, queue: &str, ids: Option<&[JobId]>) -> Result<u64> {
        self.inner.retry_dead(queue, ids).await
    }
    async fn maintain(&self, queue: &str, retention: Duration) -> Result<Maintenance> {
        self.inner.maintain(queue, retention).await
    }

    async fn try_maintain(&self, queue: &str, retention: Duration) -> Result<Option<Maintenance>> {
        self.inner.try_maintain(queue, retention).await
    }
}
