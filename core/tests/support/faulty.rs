//! A backend that misbehaves on demand: the memory backend with failing or hanging
//! heartbeats, poisoned settle calls, panicking claims.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{memory::MemoryBackend, *};

/// When a progress call came, and its reports as (job, percent).
pub type ProgressCall = (tokio::time::Instant, Vec<(JobId, u8)>);

/// How [`Faulty`] answers heartbeats.
#[derive(Clone, Copy)]
pub enum Beats {
    Pass,
    Fail,
    Hang,
}

/// The memory backend, but for its heartbeats (see [`Beats`]), for settle calls that
/// hold a failure whose error is `poison` (those are refused as a whole with
/// `InvalidInput`, as every backend refuses a call with one bad entry), and, with
/// `panic_claims`, for every claim after the first, which panics. It prefers settle
/// calls of `preferred` leases, and records the size of each call.
pub struct Faulty {
    pub inner: Arc<MemoryBackend>,
    pub beats: Beats,
    pub panic_claims: bool,
    pub claims: AtomicU32,
    pub preferred: usize,
    pub settle_calls: Mutex<Vec<usize>>,
    /// Errors the next settle calls fail with, first to last, before the call reaches
    /// the memory backend.
    pub settle_errors: Mutex<Vec<Error>>,
    /// Settle calls never answer (a server that stopped answering).
    pub hang_settles: std::sync::atomic::AtomicBool,
    /// Each progress call's reports, with when it came.
    pub progress_calls: Mutex<Vec<ProgressCall>>,
}

impl Faulty {
    pub fn new(inner: &Arc<MemoryBackend>, beats: Beats) -> Arc<Self> {
        Arc::new(Self {
            inner: inner.clone(),
            beats,
            panic_claims: false,
            claims: AtomicU32::new(0),
            preferred: DEFAULT_SETTLE_BATCH,
            settle_calls: Mutex::new(Vec::new()),
            settle_errors: Mutex::new(Vec::new()),
            hang_settles: std::sync::atomic::AtomicBool::new(false),
            progress_calls: Mutex::new(Vec::new()),
        })
    }

    pub fn settle_calls(&self) -> Vec<usize> {
        self.settle_calls.lock().unwrap().clone()
    }
}

relayq_core::delegate!(Faulty, inner => Events, Enqueue, OrderBarrier, Inspect, Admin, Schedules);

#[async_trait]
impl Claim for Faulty {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let earlier = self.claims.fetch_add(1, Ordering::SeqCst);
        assert!(
            !self.panic_claims || earlier == 0,
            "a claim panicked, for the test"
        );
        self.inner.claim_unchecked(req).await
    }
}

#[async_trait]
impl Complete for Faulty {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        self.settle_calls.lock().unwrap().push(settles.len());
        if self.hang_settles.load(std::sync::atomic::Ordering::SeqCst) {
            return std::future::pending().await;
        }
        let error = {
            let mut errors = self.settle_errors.lock().unwrap();
            (!errors.is_empty()).then(|| errors.remove(0))
        };
        if let Some(e) = error {
            return Err(e);
        }
        let poisoned = settles
            .iter()
            .any(|s| matches!(&s.outcome, Outcome::Fail { error, .. } if error == "poison"));
        if poisoned {
            return Err(Error::invalid("retry", "refused for the test"));
        }
        self.inner.settle_many_unchecked(settles).await
    }

    fn preferred_settle_batch(&self) -> usize {
        self.preferred
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        match self.beats {
            Beats::Pass => self.inner.heartbeat_unchecked(lease, extend).await,
            Beats::Fail => Err(Error::backend("unreachable, for the test")),
            Beats::Hang => std::future::pending().await,
        }
    }

    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<relayq_core::JobId>> {
        self.inner.lost_leases_unchecked(leases).await
    }

    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.inner.worker_beat_unchecked(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let seen = reports.iter().map(|r| (r.lease.job, r.percent)).collect();
        self.progress_calls
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), seen));
        self.inner.report_progress_unchecked(reports).await
    }
}
