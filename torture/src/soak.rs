//! The soak: a steady producer and a library worker for a long
//! time against the backend's own server, with pruning on (and autovacuum, on
//! PostgreSQL), and a row of figures per minute: claim p99, storage, dead rows, the
//! server's memory (Redis) and this process's memory. What a long run must not do is
//! grow: the last five minutes are compared with the first five, after one minute of
//! warm-up in which the tables fill to their steady size (finished jobs are kept for
//! [`RETENTION`] before the pruning deletes them).

use std::{
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use relayq::{
    Backend, Claim, ClaimRequest, ClaimedJob, NewJob, OnFailure,
    worker::{JobError, Worker},
};

use crate::servers::{Cluster, Fsync, Postgres, RedisNode};

/// How long finished jobs are kept before the workers' pruning deletes them.
pub const RETENTION: Duration = Duration::from_secs(30);
/// How often the workers prune.
const PRUNE_EVERY: Duration = Duration::from_secs(5);
/// The minutes compared at each end.
pub const ENDS: usize = 5;
/// The largest last-to-first ratio the goal allows.
pub const GOAL: f64 = 1.2;

/// The backends a soak runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoakKind {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL of its own, fsync and autovacuum on.
    Postgres,
    /// A Redis of its own, `appendonly yes`, `appendfsync everysec`.
    Redis,
    /// A 3-node Redis Cluster of its own, `appendfsync always` on each node.
    Cluster,
}

impl std::fmt::Display for SoakKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::Redis => "redis (appendfsync everysec)",
            Self::Cluster => "redis-cluster",
        })
    }
}

/// One minute's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Minute {
    /// Jobs finished in the minute.
    pub done: u64,
    /// Enqueued and not yet finished, at its end.
    pub backlog: u64,
    /// The 99th percentile of the minute's claim calls.
    pub claim_p99_ms: f64,
    /// Tables and indexes (PostgreSQL), the database file and its WAL (SQLite), or
    /// `used_memory` (Redis; the sum over a cluster's nodes), in MB.
    pub storage_mb: f64,
    /// PostgreSQL's `n_dead_tup` over relayq's tables; 0 elsewhere.
    pub dead_rows: u64,
    /// This process's resident memory (the worker runs in it), in MB.
    pub worker_mb: f64,
}

/// Reads one figure of a minute.
pub type Figure = fn(&Minute) -> f64;

/// The figures compared between the ends, with their names.
pub const FIGURES: [(&str, Figure); 5] = [
    ("claim p99 ms", |m| m.claim_p99_ms),
    ("storage MB", |m| m.storage_mb),
    ("dead rows", |m| as_f64(m.dead_rows)),
    ("worker MB", |m| m.worker_mb),
    ("backlog", |m| as_f64(m.backlog)),
];

/// Where the backend lives, and how to read its size.
enum Server {
    Sqlite(std::path::PathBuf),
    Postgres(Postgres),
    Redis(RedisNode),
    Cluster(Cluster),
}

/// Runs a soak of `minutes` (plus one of warm-up) at `rate` jobs per second; the
/// figures of every minute, warm-up first.
///
/// # Errors
/// When the server does not start or the backend fails.
pub async fn soak(
    kind: SoakKind,
    root: &Path,
    rate: u64,
    minutes: usize,
    on_minute: impl Fn(usize, &Minute),
) -> anyhow::Result<Vec<Minute>> {
    let (server, url) = match kind {
        SoakKind::Sqlite => {
            let file = root.join("soak.db");
            let url = format!("sqlite://{}", file.display());
            (Server::Sqlite(file), url)
        }
        SoakKind::Postgres => {
            let pg = Postgres::start(root)?;
            let url = pg.url();
            (Server::Postgres(pg), url)
        }
        SoakKind::Redis => {
            let node = RedisNode::start(root.join("redis"), Fsync::Everysec, false)?;
            let url = format!("redis://127.0.0.1:{}", node.port);
            (Server::Redis(node), url)
        }
        SoakKind::Cluster => {
            let cluster = Cluster::start(root)?;
            let url = cluster.url();
            (Server::Cluster(cluster), url)
        }
    };
    let backend: Arc<dyn Backend> = relayq::connect(&url).await.context("connect")?;
    let timed = Arc::new(Timed {
        inner: backend.clone(),
        claims: Mutex::default(),
    });
    let q = "soak".to_owned();
    let done = Arc::new(AtomicU64::new(0));
    let enqueued = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    let worker = Worker::builder(timed.clone() as Arc<dyn Backend>, [q.clone()])
        .concurrency(16)
        .maintenance(PRUNE_EVERY, RETENTION)
        .handler(move |_job: ClaimedJob| {
            let d = d.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                d.fetch_add(1, Ordering::Relaxed);
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    let producer = tokio::spawn(produce(backend.clone(), q, rate, enqueued.clone()));
    let mut out = Vec::with_capacity(minutes + 1);
    let mut last_done = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    for i in 0..=minutes {
        tick.tick().await;
        anyhow::ensure!(!producer.is_finished(), "the producer stopped");
        let now_done = done.load(Ordering::Relaxed);
        let claims =
            std::mem::take(&mut *timed.claims.lock().unwrap_or_else(PoisonError::into_inner));
        // psql and redis-cli are processes: wait for them off the runtime's threads.
        let (storage_mb, dead_rows) = tokio::task::block_in_place(|| measure(&server))?;
        let minute = Minute {
            done: now_done - last_done,
            backlog: enqueued.load(Ordering::Relaxed).saturating_sub(now_done),
            claim_p99_ms: p99(claims),
            storage_mb,
            dead_rows,
            worker_mb: rss_mb()?,
        };
        last_done = now_done;
        on_minute(i, &minute);
        out.push(minute);
    }
    producer.abort();
    worker.shutdown().await?;
    drop(server);
    Ok(out)
}

/// Last-to-first ratios of each figure, over the [`ENDS`] minutes at each end (the
/// warm-up minute left out). A figure near zero at both ends compares as 1.
#[must_use]
pub fn ratios(minutes: &[Minute]) -> Vec<(&'static str, f64, f64, f64)> {
    let steady = minutes.get(1..).unwrap_or_default();
    let n = ENDS.min(steady.len() / 2).max(1);
    FIGURES
        .iter()
        .map(|(name, get)| {
            let mean =
                |ms: &[Minute]| ms.iter().map(get).sum::<f64>() / as_f64(ms.len() as u64).max(1.0);
            let first = mean(&steady[..n.min(steady.len())]);
            let last = mean(&steady[steady.len().saturating_sub(n)..]);
            // Small counts (a backlog of 3 jobs, 20 dead rows) say nothing as a
            // ratio: below these floors both ends count as the floor. Times and
            // sizes have none: a p99 from 0.5 to 0.65 ms is 1.3x, and reported so.
            let floor = match *name {
                "backlog" | "dead rows" => 1000.0,
                _ => 0.0,
            };
            let ratio = if first.max(floor) > 0.0 {
                last.max(floor) / first.max(floor)
            } else {
                1.0
            };
            (*name, first, last, ratio)
        })
        .collect()
}

fn measure(server: &Server) -> anyhow::Result<(f64, u64)> {
    Ok(match server {
        Server::Sqlite(file) => {
            let mut bytes = 0;
            for suffix in ["", "-wal"] {
                let mut p = file.clone().into_os_string();
                p.push(suffix);
                bytes += std::fs::metadata(&p).map_or(0, |m| m.len());
            }
            (as_f64(bytes) / 1e6, 0)
        }
        Server::Postgres(pg) => {
            // Once a minute, through psql: relayq's schema, tables with their indexes
            // and TOAST, and the dead rows vacuum has yet to remove.
            let out = pg.sql(
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint || ' ' ||
                        coalesce(sum(n_dead_tup), 0)::bigint
                 FROM pg_stat_user_tables WHERE schemaname = 'relayq'",
            )?;
            let mut parts = out.split_whitespace().map(str::parse::<u64>);
            let (Some(Ok(bytes)), Some(Ok(dead))) = (parts.next(), parts.next()) else {
                anyhow::bail!("psql said {out:?}");
            };
            (as_f64(bytes) / 1e6, dead)
        }
        Server::Redis(node) => (as_f64(used_memory(node)?) / 1e6, 0),
        Server::Cluster(c) => {
            let mut used = 0;
            for node in &c.nodes {
                used += used_memory(node)?;
            }
            (as_f64(used) / 1e6, 0)
        }
    })
}

/// A Redis node's `used_memory`, in bytes.
fn used_memory(node: &RedisNode) -> anyhow::Result<u64> {
    let info = node.cli(&["info", "memory"])?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .context("no used_memory in INFO")?
        .trim()
        .parse::<u64>()?)
}

/// Enqueues what `rate` owes every 10 ms, counted in slots: of every ten slots one
/// is a grouped job (seven groups), one a sealed batch of ten jobs in two stages
/// (rounded up per tick), eight are plain jobs. So at 200 jobs/s about half the jobs
/// are batch jobs, a twentieth grouped. What was sent is what counts toward the rate.
async fn produce(b: Arc<dyn Backend>, q: String, rate: u64, enqueued: Arc<AtomicU64>) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n_total = 0u64;
    loop {
        tick.tick().await;
        let owed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX) * rate / 1000;
        let n = owed
            .saturating_sub(enqueued.load(Ordering::Relaxed))
            .min(1000);
        if n == 0 {
            continue;
        }
        let mut jobs = Vec::new();
        let mut in_batches: u64 = 0;
        for _ in 0..n {
            n_total += 1;
            match n_total % 10 {
                0 => jobs.push(NewJob::new(&q, vec![b'g'; 64]).group(format!("g{}", n_total % 7))),
                1 => in_batches += 1,
                _ => jobs.push(NewJob::new(&q, vec![b'x'; 64])),
            }
        }
        let mut sent = 0;
        let plain = jobs.len() as u64;
        if b.enqueue(jobs).await.is_ok() {
            sent += plain;
        }
        // Batches of ten, in two stages, sealed: what is owed to batches rounds up.
        for _ in 0..in_batches.div_ceil(10) {
            if let Ok(batch) = b.open_batch(&q, OnFailure::Continue).await {
                let staged = (0..10)
                    .map(|i| NewJob::new(&q, vec![b'b'; 64]).in_batch(batch.id, i / 5))
                    .collect();
                if b.enqueue(staged).await.is_ok() {
                    sent += 10;
                }
                let _ = b.seal(&batch).await;
            }
        }
        enqueued.fetch_add(sent, Ordering::Relaxed);
    }
}

/// Times each claim; everything else is the backend's.
struct Timed {
    inner: Arc<dyn Backend>,
    claims: Mutex<Vec<f64>>,
}

relayq::delegate!(Timed, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin, Schedules);

#[relayq::async_trait]
impl Claim for Timed {
    async fn claim_unchecked(&self, req: ClaimRequest) -> relayq::Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> relayq::Result<relayq::Claimed> {
        let start = Instant::now();
        let out = self.inner.claim_paced_unchecked(req).await;
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(start.elapsed().as_secs_f64() * 1000.0);
        out
    }
}

fn p99(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[(xs.len() - 1) * 99 / 100]
}

/// This process's resident set (`VmRSS`), in MB.
fn rss_mb() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(as_f64(kb) / 1e3)
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(storage_mb: f64) -> Minute {
        Minute {
            storage_mb,
            ..Minute::default()
        }
    }

    #[test]
    fn ratios_leave_out_the_warm_up_and_compare_the_ends() {
        // Warm-up 1 MB, then 10 MB for five minutes and 13 at the end: 1.3.
        let mut ms = vec![minute(1.0)];
        ms.extend((0..5).map(|_| minute(10.0)));
        ms.extend((0..10).map(|_| minute(11.0)));
        ms.extend((0..5).map(|_| minute(13.0)));
        let storage = ratios(&ms)
            .into_iter()
            .find(|r| r.0 == "storage MB")
            .unwrap();
        assert!((storage.1 - 10.0).abs() < 1e-9 && (storage.2 - 13.0).abs() < 1e-9);
        assert!((storage.3 - 1.3).abs() < 1e-9, "{storage:?}");
        // A backlog of a few jobs at both ends is under the floor: no growth.
        let backlog = ratios(&ms).into_iter().find(|r| r.0 == "backlog").unwrap();
        assert!((backlog.3 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_sub_millisecond_claim_p99_that_grows_is_reported() {
        let at = |claim_p99_ms| Minute {
            claim_p99_ms,
            ..Minute::default()
        };
        let mut ms = vec![at(2.0)];
        ms.extend((0..5).map(|_| at(0.5)));
        ms.extend((0..5).map(|_| at(0.65)));
        let p99 = ratios(&ms)
            .into_iter()
            .find(|r| r.0 == "claim p99 ms")
            .unwrap();
        assert!((p99.3 - 1.3).abs() < 1e-9, "{p99:?}");
    }
}
