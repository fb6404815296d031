//! Scenario 8: a producer at a fixed rate under churn, after the phases of
//! the independent long-horizon PostgreSQL queue benchmark: `clean` (steady producer
//! and worker), `idle-in-tx` (a second session holds `BEGIN; SELECT txid_current();`
//! open, so vacuum cannot remove the rows each job leaves dead), `recovery` (that
//! transaction ended), then `rr-readers` (four sessions hold REPEATABLE READ snapshots:
//! one read `jobs`, one `finished`, one `queues`, one an unrelated catalog table) and
//! `rr-recovery` (they ended). The producer enqueues every 10 ms what the rate owes; one
//! `Worker` with default settings (16 slots, automatic prefetch) runs 1 ms jobs of
//! 256 bytes, each stamped with the time it was enqueued. Per phase: completions per
//! second (mean, and the minimum over 5 s windows), claim p50 and p99, pickup p50 and
//! p99 (enqueue to the handler's start), the backlog at the end, and on PostgreSQL the
//! dead rows and size of `jobs`; for `recovery` and `rr-recovery`, the seconds until
//! the backlog was gone.
//! Against the suite's own PostgreSQL (autovacuum on, `.ci/run`). SQLite and Redis run
//! the same phases without a transaction to hold, as a check that nothing regressed.
//! With the peers built, graphile_worker runs them too, after the raw loop at each rate
//! (bench/peers/src/graphile_phases.rs).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use relayq::{
    ClaimedJob, NewJob,
    worker::{JobError, Worker},
};
use sqlx::Connection;

use crate::{
    Row, median,
    peers::Peers,
    targets::{Cleanup, Target},
    timed::Timed,
};

pub(crate) const SLOTS: u32 = 16;
pub(crate) const PAYLOAD: usize = 256;
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// Completion rates are judged over windows this long.
const WINDOW: u64 = 5;
pub(crate) const PHASES: [&str; 5] = [
    "clean",
    "idle-in-tx",
    "recovery",
    "rr-readers",
    "rr-recovery",
];

pub async fn phases(
    targets: &[Target],
    peers: &Peers,
    rates: &[u64],
    phase: Duration,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        // The raw loop first, at every rate: the server's floor under the same phases;
        // then each PostgreSQL peer (graphile_worker) at that rate, on the same server.
        if let Target::Postgres(url) = t {
            for &rate in rates {
                let found = crate::phases_raw::once(url, rate, phase).await?;
                crate::print(&found);
                rows.extend(found);
                for p in peers.running("phases") {
                    match peers.phases(p, rate, phase).await {
                        Ok(found) => {
                            crate::print(&found);
                            rows.extend(found);
                        }
                        // Reported, not fatal, as in the other scenarios.
                        Err(e) => crate::say(&format!("{p} phases {rate}/s failed: {e}")),
                    }
                }
            }
        }
        let rates: &[u64] = match t {
            Target::Postgres(_) => rates,
            // The check that nothing regressed: the middle rate only.
            Target::Sqlite(_) | Target::Redis(_) => &rates[rates.len() / 2..=rates.len() / 2],
            _ => continue,
        };
        for &rate in rates {
            let found = once(t, rate, phase).await?;
            crate::print(&found);
            rows.extend(found);
        }
    }
    Ok(rows)
}

/// Counts shared by the producer, the worker's handler and the sampler.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) enqueued: AtomicU64,
    pub(crate) done: AtomicU64,
    /// Milliseconds from each job's enqueue to its start, in this phase.
    pub(crate) pickups: Mutex<Vec<f64>>,
}

impl Counts {
    /// A job stamped by [`stamped`] started now.
    pub(crate) fn picked(&self, payload: &[u8]) {
        let Some(at) = payload.get(..8).and_then(|b| b.try_into().ok()) else {
            return;
        };
        let waited = u64::try_from(now_micros() - i64::from_le_bytes(at)).unwrap_or(0);
        let ms = as_f64(waited) / 1000.0;
        self.pickups.lock().expect("not poisoned").push(ms);
    }

    pub(crate) fn take_pickups(&self) -> Vec<f64> {
        std::mem::take(&mut *self.pickups.lock().expect("not poisoned"))
    }
}

/// Microseconds since the epoch, on the machine's clock (producer and worker share it).
fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// A [`PAYLOAD`]-byte payload that starts with the time it was made.
pub(crate) fn stamped() -> Vec<u8> {
    let mut p = vec![b'x'; PAYLOAD];
    p[..8].copy_from_slice(&now_micros().to_le_bytes());
    p
}

async fn once(t: &Target, rate: u64, phase: Duration) -> anyhow::Result<Vec<Row>> {
    let (b, cleanup) = t.open_isolated(&format!("phases{rate}")).await?;
    let q = crate::scenarios::queue("phases");
    let timed = Arc::new(Timed::new(b.clone()));
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    let worker = Worker::builder(timed.clone(), [q.clone()])
        .concurrency(SLOTS)
        .handler(move |job: ClaimedJob| {
            let c = c.clone();
            c.picked(&job.payload);
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                c.done.fetch_add(1, Ordering::Relaxed);
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    let producer = tokio::spawn(produce(b.clone(), q.clone(), rate, counts.clone()));
    let mut rows = Vec::new();
    let scenario = |phase: &str, what: &str| format!("phases {rate}/s, {phase}: {what}");
    for name in PHASES {
        let held = match (t, &cleanup) {
            (Target::Postgres(url), Cleanup::Schema(_, schema)) => {
                let tables = ["jobs", "finished", "queues"].map(|t| format!("\"{schema}\".{t}"));
                pin(name, url, &tables).await?
            }
            _ => Vec::new(),
        };
        timed.take();
        counts.take_pickups();
        let samples = sample(&counts, phase).await;
        for c in held {
            c.close().await?;
        }
        let pickups = counts.take_pickups();
        let claims: Vec<f64> = timed
            .take()
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        let (mean, min) = rates(&samples);
        let backlog = samples.last().map_or(0, |s| s.1.saturating_sub(s.2));
        let mut figures = vec![
            ("done/s mean", mean, "jobs/s"),
            ("done/s min 5 s", min, "jobs/s"),
            ("claim p50", median(claims.clone()), "ms"),
            ("claim p99", percentile(claims, 0.99), "ms"),
            ("pickup p50", median(pickups.clone()), "ms"),
            ("pickup p99", percentile(pickups, 0.99), "ms"),
            ("backlog at end", as_f64(backlog), "jobs"),
        ];
        if name.ends_with("recovery") {
            figures.push(("backlog gone after", drained_after(&samples, rate), "s"));
        }
        if let Cleanup::Schema(pool, schema) = &cleanup {
            let (dead, bytes) = jobs_table(pool, schema).await?;
            figures.push(("jobs dead rows", as_f64(dead), "rows"));
            figures.push(("jobs size", as_f64(bytes) / 1e6, "MB"));
        }
        for (what, value, unit) in figures {
            rows.push(Row {
                scenario: scenario(name, what),
                target: t.label().to_owned(),
                value,
                unit,
                note: String::new(),
            });
        }
    }
    producer.abort();
    let _ = producer.await;
    worker.shutdown().await?;
    cleanup.run().await?;
    Ok(rows)
}

/// Enqueues what `rate` owes every [`TICK`], in one call.
async fn produce(b: Arc<dyn relayq::Backend>, q: String, rate: u64, counts: Arc<Counts>) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let owed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX) * rate / 1000;
        let sent = counts.enqueued.load(Ordering::Relaxed);
        let n = owed.saturating_sub(sent).min(10_000);
        if n == 0 {
            continue;
        }
        let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new(&q, stamped())).collect();
        if b.enqueue(jobs).await.is_ok() {
            counts.enqueued.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// A session holding a transaction with an id open: vacuum keeps every row version
/// dead since it began.
pub(crate) async fn hold(url: &str) -> anyhow::Result<sqlx::PgConnection> {
    let mut c = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("BEGIN; SELECT txid_current();")
        .execute(&mut c)
        .await?;
    Ok(c)
}

/// The sessions that pin vacuum's horizon through `phase`: for `idle-in-tx` one
/// transaction with an id; for `rr-readers` four REPEATABLE READ transactions, each
/// having read a row of one of `tables` (up to three), the others a catalog table
/// unrelated to the queue. One row: a count of a bloated table would take seconds
/// outside the phase's clock. None for the other phases.
pub(crate) async fn pin(
    phase: &str,
    url: &str,
    tables: &[String],
) -> anyhow::Result<Vec<sqlx::PgConnection>> {
    match phase {
        "idle-in-tx" => Ok(vec![hold(url).await?]),
        "rr-readers" => {
            let unrelated = [
                "pg_catalog.pg_class",
                "pg_catalog.pg_type",
                "pg_catalog.pg_proc",
            ];
            let mut read: Vec<&str> = tables.iter().map(String::as_str).take(3).collect();
            read.extend(unrelated.iter().take(4 - read.len()));
            let mut held = Vec::new();
            for table in read {
                let mut c = sqlx::PgConnection::connect(url).await?;
                let sql = format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM {table} LIMIT 1;"
                );
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut c)
                    .await?;
                held.push(c);
            }
            Ok(held)
        }
        _ => Ok(Vec::new()),
    }
}

/// (seconds since the phase began, enqueued, done) once a second.
pub(crate) async fn sample(counts: &Counts, phase: Duration) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let seconds = phase.as_secs();
    for s in 0..=seconds {
        tick.tick().await;
        out.push((
            s,
            counts.enqueued.load(Ordering::Relaxed),
            counts.done.load(Ordering::Relaxed),
        ));
    }
    out
}

/// Mean completions per second over the phase, and the lowest over its whole
/// [`WINDOW`]-second windows.
pub(crate) fn rates(samples: &[(u64, u64, u64)]) -> (f64, f64) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return (0.0, 0.0);
    };
    let mean = as_f64(last.2 - first.2) / as_f64((last.0 - first.0).max(1));
    let min = samples
        .windows(usize::try_from(WINDOW).unwrap_or(5) + 1)
        .step_by(usize::try_from(WINDOW).unwrap_or(5))
        .map(|w| as_f64(w[w.len() - 1].2 - w[0].2) / as_f64(WINDOW))
        .fold(f64::INFINITY, f64::min);
    (mean, if min.is_finite() { min } else { mean })
}

/// Seconds into the phase until the backlog was down to a tenth of a second's jobs
/// (what is in flight), or the phase's length when it never was.
pub(crate) fn drained_after(samples: &[(u64, u64, u64)], rate: u64) -> f64 {
    samples
        .iter()
        .find(|(_, enq, done)| enq.saturating_sub(*done) <= rate / 10 + u64::from(SLOTS))
        .or(samples.last())
        .map_or(0.0, |s| as_f64(s.0))
}

/// Dead rows and total size (with indexes) of the schema's `jobs` table.
pub(crate) async fn jobs_table(pool: &sqlx::PgPool, schema: &str) -> anyhow::Result<(u64, u64)> {
    let (dead, bytes): (i64, i64) = sqlx::query_as(
        "SELECT n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables
         WHERE schemaname = $1 AND relname = 'jobs'",
    )
    .bind(schema)
    .fetch_one(pool)
    .await?;
    Ok((u64::try_from(dead)?, u64::try_from(bytes)?))
}

#[allow(clippy::cast_precision_loss)]
pub(crate) fn as_f64(n: u64) -> f64 {
    n as f64
}

pub(crate) fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((xs.len() - 1) as f64 * p).round() as usize;
    xs[at]
}
