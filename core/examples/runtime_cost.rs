//! What the worker runtime itself costs per job: a worker drains no-op jobs from a
//! backend that answers every claim and settle at once, with no server behind it, and
//! the process's CPU time is divided by the jobs. A rough gauge of the runtime's own
//! share of a real drain, not the benchmark (that is `bench/`).
//!
//! ```sh
//! cargo run --release -p relayq-core --example runtime_cost -- 500000 16 256
//! ```
//!
//! Arguments: jobs (500,000), worker concurrency (16), worker prefetch (256).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    memory::MemoryBackend,
    worker::{JobError, Worker},
    *,
};

/// Claims hand out made-up jobs until `left` runs out; settles count and succeed.
/// Everything but claiming and settling goes to an unused memory backend.
struct Immediate {
    unused: MemoryBackend,
    left: AtomicU64,
    next: AtomicU64,
    settled: AtomicU64,
}

impl Events for Immediate {}

relayq_core::delegate!(Immediate, unused => Enqueue, OrderBarrier, Inspect, Admin, Schedules);

#[async_trait]
impl Claim for Immediate {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left - left.min(u64::from(req.limit)))
            })
            .unwrap_or_default();
        let n = taken.min(u64::from(req.limit));
        let first = self.next.fetch_add(n, Ordering::SeqCst);
        let now = Utc::now();
        Ok((first..first + n)
            .map(|id| ClaimedJob {
                lease: Lease {
                    queue: req.queue.clone(),
                    job: JobId(i64::try_from(id).unwrap_or(i64::MAX)),
                    token: LeaseToken::random(),
                    attempt: 1,
                    expires_at: now + req.lease,
                    worker: req.worker.clone(),
                },
                payload: vec![7; 100],
                priority: 0,
                run_at: now,
                max_attempts: 3,
                group: None,
                batch: None,
                stage: None,
                enqueued_by: None,
            })
            .collect())
    }
}

#[async_trait]
impl Complete for Immediate {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        self.settled
            .fetch_add(settles.len() as u64, Ordering::SeqCst);
        Ok(settles.iter().map(|_| Ok(Settled::Completed)).collect())
    }

    fn preferred_settle_batch(&self) -> usize {
        512
    }

    async fn heartbeat_unchecked(&self, _lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        Ok(Utc::now() + extend)
    }

    /// Every job runs to its end here: no lease is ever lost.
    async fn lost_leases_unchecked(&self, _leases: &[Lease]) -> Result<Vec<relayq_core::JobId>> {
        Ok(Vec::new())
    }

    async fn report_progress_unchecked(
        &self,
        _reports: &[relayq_core::ProgressReport],
    ) -> Result<Vec<relayq_core::JobId>> {
        Ok(Vec::new())
    }

    /// Nobody looks at beats here.
    async fn worker_beat_unchecked(
        &self,
        _queue: &str,
        _beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        Ok(())
    }
}

/// This process's CPU time so far (user and system), from `/proc` (Linux).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

#[tokio::main]
#[allow(clippy::cast_precision_loss)]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(500_000), |a| a.parse())?;
    let concurrency: u32 = args.next().map_or(Ok(16), |a| a.parse())?;
    let prefetch: u32 = args.next().map_or(Ok(256), |a| a.parse())?;
    let backend = Arc::new(Immediate {
        unused: MemoryBackend::new(),
        left: AtomicU64::new(n),
        next: AtomicU64::new(1),
        settled: AtomicU64::new(0),
    });
    let (cpu, start) = (cpu_seconds(), Instant::now());
    let worker = Worker::builder(backend.clone(), ["gauge"])
        .concurrency(concurrency)
        .prefetch(prefetch)
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()?
        .spawn();
    while backend.settled.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (cpu, took) = (
        cpu_seconds().zip(cpu).map(|(b, a)| b - a),
        start.elapsed().as_secs_f64(),
    );
    worker.shutdown().await?;
    let per_job = cpu.map_or_else(
        || "unknown (no /proc)".to_owned(),
        |c| format!("{:.2} µs", c * 1e6 / n as f64),
    );
    let mut out = std::io::stdout().lock();
    std::io::Write::write_fmt(
        &mut out,
        format_args!(
            "{n} no-op jobs (concurrency {concurrency}, prefetch {prefetch}): {:.0} jobs/s, \
             CPU per job {per_job}\n",
            n as f64 / took
        ),
    )?;
    Ok(())
}
