//! What every peer shares: the payload, the probe its handler reports to, the enqueue
//! drivers and the one JSON line printed at the end.

use std::{
    collections::HashSet,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Tasks that enqueue one job at a time, as in relayq's benchmark.
pub const ENQUEUE_TASKS: usize = 8;
/// Jobs per call in the batched enqueue (and in every untimed pre-enqueue).
pub const BATCH: usize = 1000;
/// The steady rate of the latency scenario.
pub const LATENCY_RATE: u64 = 500;
/// Queues of the groups scenario.
pub const GROUPS: usize = 100;
/// How long workers idle before the latency scenario's first job.
pub const IDLE: Duration = Duration::from_secs(1);
/// How long a run may take before it is declared stuck.
pub const STUCK: Duration = Duration::from_secs(600);

/// The job: about 100 bytes of JSON, carrying its enqueue time (µs since the epoch)
/// and, in the groups scenario, its queue's index.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Payload {
    pub at: i64,
    pub g: u32,
    pub pad: String,
}

impl Payload {
    /// A job stamped now.
    pub fn now(g: u32) -> Self {
        Self {
            at: now_micros(),
            g,
            pad: "x".repeat(62),
        }
    }
}

pub fn now_micros() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A name no other run uses: the process id and the time in µs.
pub fn unique(tag: &str) -> String {
    format!("{tag}_{}_{}", std::process::id(), now_micros())
}

#[allow(clippy::cast_precision_loss)]
pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// What a handler reports to: completions (and a wake-up when all `target` are in),
/// start latencies, and which groups are running (to catch two jobs of one group
/// running at once).
pub struct Probe {
    target: usize,
    done: AtomicUsize,
    all_done: Notify,
    latency: Option<Mutex<Histogram<u64>>>,
    groups: Option<Mutex<HashSet<u32>>>,
    overlap: AtomicBool,
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Probe({}/{})",
            self.done.load(Ordering::Relaxed),
            self.target
        )
    }
}

impl Probe {
    pub fn new(target: usize, latency: bool, groups: bool) -> anyhow::Result<Arc<Self>> {
        let latency = if latency {
            Some(Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3)?))
        } else {
            None
        };
        Ok(Arc::new(Self {
            target,
            done: AtomicUsize::new(0),
            all_done: Notify::new(),
            latency,
            groups: groups.then(Mutex::default),
            overlap: AtomicBool::new(false),
        }))
    }

    /// The no-op handler's body.
    pub async fn handle(&self, job: &Payload) {
        if let Some(h) = &self.latency {
            let waited = u64::try_from(now_micros() - job.at).unwrap_or(0).max(1);
            h.lock().expect("histogram").saturating_record(waited);
        }
        if let Some(running) = &self.groups {
            if !running.lock().expect("groups").insert(job.g) {
                self.overlap.store(true, Ordering::SeqCst);
            }
            // One yield, so that a second job of the group, if the peer let one start,
            // has a window in which to be seen.
            tokio::task::yield_now().await;
            running.lock().expect("groups").remove(&job.g);
        }
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.target {
            self.all_done.notify_one();
        }
    }

    /// Waits until every job has been handled.
    pub async fn wait(&self) -> anyhow::Result<()> {
        tokio::time::timeout(STUCK, self.all_done.notified())
            .await
            .with_context(|| {
                format!(
                    "stuck: {} of {} jobs handled after {STUCK:?}",
                    self.done.load(Ordering::Acquire),
                    self.target
                )
            })
    }

    /// Fails if two jobs of one group ever ran at once.
    pub fn check_groups(&self) -> anyhow::Result<()> {
        if self.overlap.load(Ordering::SeqCst) {
            bail!("two jobs of one queue_name ran at the same time");
        }
        Ok(())
    }

    /// p50, p99 and max of the start latencies, in ms.
    #[allow(clippy::cast_precision_loss)]
    pub fn latencies(&self) -> Option<[f64; 3]> {
        let h = self.latency.as_ref()?.lock().ok()?;
        let ms = |us: u64| us as f64 / 1000.0;
        Some([
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max()),
        ])
    }
}

/// Runs `push(count)` on [`ENQUEUE_TASKS`] tasks at once, `count` jobs each; returns
/// the jobs pushed and the time taken.
pub async fn from_tasks<F, Fut>(n: usize, push: F) -> anyhow::Result<(usize, Duration)>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let each = n / ENQUEUE_TASKS;
    let start = Instant::now();
    let tasks: Vec<_> = (0..ENQUEUE_TASKS)
        .map(|_| tokio::spawn(push(each)))
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok((each * ENQUEUE_TASKS, start.elapsed()))
}

/// The latency scenario's enqueue side, as relayq's own: `n` freshly stamped jobs, one
/// push per tick at [`LATENCY_RATE`] a second, each awaited before the next (a missed
/// tick delays the rest). Whether the rate held is reported on stderr: if pushes are
/// slower than a tick, the peer was offered less than 500/s.
pub async fn steady<F, Fut>(n: usize, mut push: F) -> anyhow::Result<()>
where
    F: FnMut(Payload) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    for _ in 0..n {
        tick.tick().await;
        push(Payload::now(0)).await?;
    }
    #[allow(clippy::cast_precision_loss)]
    let target = n as f64 / LATENCY_RATE as f64;
    eprintln!(
        "latency: {n} jobs pushed in {:.2}s ({target:.2}s at {LATENCY_RATE}/s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The groups scenario's jobs: `n` rounded down to whole rounds of [`GROUPS`], group
/// `i % GROUPS` for the `i`-th, so that the queues interleave.
pub fn group_jobs(n: usize) -> Vec<Payload> {
    let n = n / GROUPS * GROUPS;
    (0..n)
        .map(|i| Payload::now(u32::try_from(i % GROUPS).unwrap_or(0)))
        .collect()
}

/// One measurement's result, printed as the only line on stdout.
pub struct Outcome {
    pub value: f64,
    pub unit: &'static str,
    pub latency: Option<[f64; 3]>,
    pub settings: String,
    /// A scenario of many figures (phases): printed in place of `value` and `unit`.
    pub rows: Vec<Figure>,
}

/// One of a scenario's many figures, named as relayq's bench names its rows.
#[derive(Serialize)]
pub struct Figure {
    pub scenario: String,
    pub value: f64,
    pub unit: &'static str,
}

impl Outcome {
    pub fn rate(n: usize, d: Duration, settings: String) -> Self {
        Self {
            value: rate(n, d),
            unit: "jobs/s",
            latency: None,
            settings,
            rows: Vec::new(),
        }
    }

    /// A scenario of many figures.
    pub fn rows(rows: Vec<Figure>, settings: String) -> Self {
        Self {
            value: f64::NAN,
            unit: "",
            latency: None,
            settings,
            rows,
        }
    }

    /// The latency scenario's outcome: value = p50.
    pub fn latency(probe: &Probe, settings: String) -> anyhow::Result<Self> {
        let l = probe.latencies().context("no latency histogram")?;
        Ok(Self {
            value: l[0],
            unit: "ms",
            latency: Some(l),
            settings,
            rows: Vec::new(),
        })
    }
}
