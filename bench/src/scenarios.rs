//! Scenarios 1 (enqueue) and 2 (drain), run on every target in turn, `runs` times.
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use relayq::{
    Backend, ClaimedJob, EnqueueExt, NewJob,
    worker::{JobError, Worker},
};
use tokio::sync::Notify;

use crate::{
    Row, median,
    peers::Peers,
    targets::{Cleanup, Target},
};

pub(crate) fn queue(tag: &str) -> String {
    format!("bench-{tag}-{}-{}", std::process::id(), fastrand_suffix())
}

fn fastrand_suffix() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or_default()
}

pub(crate) fn job(q: &str) -> NewJob {
    NewJob::new(q, vec![b'x'; 100])
}

#[allow(clippy::cast_precision_loss)]
pub(crate) fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// A peer's counterpart of a scenario: (peer scenario name, jobs, concurrency).
pub(crate) type PeerJob<'a> = Option<(&'a Peers, &'a str, usize, u32)>;

/// Runs `measure` on each target `runs` times, interleaved (A B A B, peers included),
/// and reports medians. With `isolated`, each measurement gets a namespace of its own
/// (schema, key prefix or file), removed afterwards: for scenarios that leave jobs
/// behind, which would otherwise pile up under every later measurement.
/// What a measure returns on a backend that refuses what it measures by design (a
/// backend that keeps no limit keys): [`each`] leaves that target out of the scenario's
/// rows and says so.
pub(crate) const NOT_KEPT: f64 = f64::NAN;

pub(crate) async fn each<F, Fut>(
    targets: &[Target],
    runs: usize,
    scenario: &str,
    peer: PeerJob<'_>,
    isolated: bool,
    measure: F,
) -> anyhow::Result<Vec<Row>>
where
    F: Fn(Arc<dyn Backend>, usize) -> Fut,
    Fut: Future<Output = anyhow::Result<f64>>,
{
    let peers: Vec<&str> = peer.map(|(p, s, ..)| p.running(s)).unwrap_or_default();
    let mut samples: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    let mut peer_samples: Vec<Vec<f64>> = peers.iter().map(|_| Vec::new()).collect();
    let mut notes: Vec<String> = peers.iter().map(|_| String::new()).collect();
    let mut failed = vec![0; peers.len()];
    for run in 0..runs {
        for (i, t) in targets.iter().enumerate() {
            let (backend, cleanup) = if isolated {
                t.open_isolated(&format!("m{}_{run}_{i}", std::process::id()))
                    .await?
            } else {
                (t.open().await?, Cleanup::None)
            };
            samples[i].push(measure(backend, t.scale()).await?);
            cleanup.run().await?;
        }
        if let Some((p, s, jobs, concurrency)) = peer {
            for (i, name) in peers.iter().enumerate() {
                // A peer that fails (apalis-redis cannot drain more than about 8,000
                // jobs, see bench/README.md) is reported, not fatal.
                match p.run(name, s, jobs, concurrency).await {
                    Ok(m) => {
                        peer_samples[i].push(m.value);
                        notes[i] = m.settings;
                    }
                    Err(e) => {
                        crate::say(&format!("{name} {scenario}: a run failed: {e}"));
                        failed[i] += 1;
                        if peer_samples[i].is_empty() {
                            notes[i] = format!("FAILED: {e}");
                        }
                    }
                }
            }
        }
    }
    let ours = targets
        .iter()
        .zip(samples)
        .filter(|(t, s)| {
            let kept = !s.iter().all(|v| v.is_nan());
            if !kept {
                crate::say(&format!(
                    "{} keeps no such thing: {scenario} not run",
                    t.label()
                ));
            }
            kept
        })
        .map(|(t, s)| Row {
            scenario: scenario.to_owned(),
            target: t.label().to_owned(),
            value: median(s),
            unit: "jobs/s",
            note: String::new(),
        });
    let theirs = peers
        .iter()
        .zip(peer_samples)
        .zip(notes)
        .zip(failed)
        .filter_map(|(((p, s), mut note), failed)| {
            if s.is_empty() {
                // Every run of this peer failed; say so once, with the reason.
                crate::say(&format!("{p} could not run {scenario}: {note}"));
                return None;
            }
            if failed > 0 {
                note.push_str(&format!(
                    "; {failed} of {runs} runs failed, the figure is the others'"
                ));
            }
            Some((p, s, note))
        })
        .map(|(p, s, note)| Row {
            scenario: scenario.to_owned(),
            target: (*p).to_owned(),
            value: median(s),
            unit: "jobs/s",
            note,
        });
    Ok(ours.chain(theirs).collect())
}

/// Scenario 1: `n / share` jobs of 100 bytes one at a time from 8 tasks, and `n` in
/// batches of 1,000.
pub async fn enqueue(
    targets: &[Target],
    peers: &Peers,
    n: usize,
    share: usize,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = each(
        targets,
        runs,
        "enqueue 1 x 8 tasks",
        Some((peers, "enqueue-single", n / share, 8)),
        true,
        |b, scale| async move {
            let n = n / share / scale;
            let q = queue("enq1");
            let start = Instant::now();
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let (b, q) = (b.clone(), q.clone());
                    tokio::spawn(async move {
                        for _ in 0..n / 8 {
                            b.enqueue_one(job(&q)).await?;
                        }
                        anyhow::Ok(())
                    })
                })
                .collect();
            for t in tasks {
                t.await??;
            }
            let r = rate(n / 8 * 8, start.elapsed());
            clean(&*b, &q).await?;
            Ok(r)
        },
    )
    .await?;
    rows.extend(
        each(
            targets,
            runs,
            "enqueue batches of 1000",
            Some((peers, "enqueue-batch", n, 1)),
            true,
            |b, scale| async move {
                let n = (n / scale).max(1000);
                let q = queue("enqb");
                let start = Instant::now();
                for _ in 0..n / 1000 {
                    b.enqueue((0..1000).map(|_| job(&q)).collect()).await?;
                }
                let r = rate(n / 1000 * 1000, start.elapsed());
                clean(&*b, &q).await?;
                Ok(r)
            },
        )
        .await?,
    );
    Ok(rows)
}

/// Scenario 2: `n` pre-enqueued no-op jobs drained by a worker of `concurrency`, as a
/// user gets it (`None`: the automatic prefetch) or claiming a fixed `prefetch` ahead
/// of its free slots (`Some(0)`: only for free slots); the clock stops when the worker
/// has stopped with every outcome stored. Peers run the default rows (their own
/// settings already fetch ahead, see `peers.rs`).
pub async fn drain(
    targets: &[Target],
    peers: &Peers,
    n: usize,
    concurrency: u32,
    prefetch: Option<u32>,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let name = match prefetch {
        None => format!("drain, concurrency {concurrency}"),
        Some(p) => format!("drain, concurrency {concurrency}, prefetch {p}"),
    };
    let peer = prefetch
        .is_none()
        .then_some((peers, "drain", n, concurrency));
    each(targets, runs, &name, peer, false, |b, scale| async move {
        let n = (n / scale).max(1000);
        let q = queue("drain");
        for _ in 0..n.div_ceil(1000) {
            b.enqueue((0..1000).map(|_| job(&q)).collect()).await?;
        }
        let n = n.div_ceil(1000) * 1000;
        let r = run_worker_seeing(b.clone(), &q, n, concurrency, prefetch, None, |_| {}).await?;
        clean(&*b, &q).await?;
        Ok(r)
    })
    .await
}

/// Drains the `n` jobs waiting in `q` with a worker of `concurrency` and `prefetch`;
/// jobs/s, the clock stopping when the worker has stopped with every outcome stored.
pub(crate) async fn run_worker(
    b: Arc<dyn Backend>,
    q: &str,
    n: usize,
    concurrency: u32,
    prefetch: u32,
) -> anyhow::Result<f64> {
    run_worker_seeing(b, q, n, concurrency, Some(prefetch), None, |_| {}).await
}

/// [`run_worker`] with the worker's default prefetch when `prefetch` is `None`, its
/// lease set when given, calling `see` with each job as its handler starts.
pub(crate) async fn run_worker_seeing(
    b: Arc<dyn Backend>,
    q: &str,
    n: usize,
    concurrency: u32,
    prefetch: Option<u32>,
    lease: Option<Duration>,
    see: impl Fn(&ClaimedJob) + Send + Sync + 'static,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let all_done = Arc::new(Notify::new());
    let (d, a, see) = (done.clone(), all_done.clone(), Arc::new(see));
    let start = Instant::now();
    let mut builder = Worker::builder(b, [q.to_owned()]).concurrency(concurrency);
    if let Some(prefetch) = prefetch {
        builder = builder.prefetch(prefetch);
    }
    if let Some(lease) = lease {
        builder = builder.lease(lease);
    }
    let worker = builder
        .handler(move |job: ClaimedJob| {
            let (d, a, see) = (d.clone(), a.clone(), see.clone());
            async move {
                see(&job);
                if d.fetch_add(1, Ordering::Relaxed) + 1 == n as u64 {
                    a.notify_one();
                }
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    all_done.notified().await;
    worker.shutdown().await?;
    Ok(rate(n, start.elapsed()))
}

/// Drops what a measurement left behind.
pub(crate) async fn clean(b: &dyn Backend, q: &str) -> anyhow::Result<()> {
    b.maintain(q, Duration::ZERO).await?;
    Ok(())
}
