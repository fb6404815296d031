//! relayq's phases scenario (bench/src/phases.rs) on graphile_worker, with
//! the worker of graphile.rs (the guide's throughput-oriented settings). A producer
//! adds every 10 ms what `--rate` owes (at most 10,000) in one `WorkerUtils::add_jobs`;
//! the handler sleeps 1 ms per job of about 256 bytes; three phases of `--phase-secs`:
//! `clean`, `idle-in-tx` (a second session holds `BEGIN; SELECT txid_current();`
//! open), `recovery`. The figures are the bench's, computed as it computes them, with
//! one exception: graphile_worker does not expose how long its claim takes, so in
//! place of claim p50/p99 this reports the pickup latency (the enqueue stamp in the
//! payload to the handler's start, as `common::Probe` measures it for the latency
//! scenario) as "pickup p50" / "pickup p99".

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use graphile_worker::{IntoTaskHandlerResult, JobSpec, TaskHandler, WorkerContext, WorkerUtils};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgPool};

use crate::{
    Args,
    common::{Figure, Outcome, Payload, now_micros},
};

const TICK: Duration = Duration::from_millis(10);
const MOST_PER_TICK: u64 = 10_000;
/// The payload's JSON around its pad, `{"at":<16 digits>,"g":0,"pad":""}`, is 38
/// bytes: this pad makes it 256, the bench's payload.
const PAD: usize = 256 - 38;
/// Completion rates are judged over windows this long (as the bench's `WINDOW`).
const WINDOW: usize = 5;
const PHASES: [&str; 3] = ["clean", "idle-in-tx", "recovery"];

/// What the producer, the handler and the sampler share.
#[derive(Debug)]
struct State {
    enqueued: AtomicU64,
    done: AtomicU64,
    /// Pickup latencies (µs) of the current phase.
    pickup: Mutex<Histogram<u64>>,
}

/// The state, handed to the handler as a worker extension.
#[derive(Clone, Debug)]
struct Shared(Arc<State>);

/// The job: its own task identifier, so that its handler is the 1 ms one.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct Job(Payload);

impl Job {
    fn now() -> Self {
        Self(Payload {
            at: now_micros(),
            g: 0,
            pad: "x".repeat(PAD),
        })
    }
}

impl TaskHandler for Job {
    const IDENTIFIER: &'static str = "relayq_bench_phases";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        let Some(Shared(state)) = ctx.get_ext::<Shared>() else {
            return Err("no state extension".to_owned());
        };
        let waited = u64::try_from(now_micros() - self.0.at).unwrap_or(0).max(1);
        state
            .pickup
            .lock()
            .expect("histogram")
            .saturating_record(waited);
        tokio::time::sleep(Duration::from_millis(1)).await;
        state.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

pub async fn measure(
    args: &Args,
    pool: &PgPool,
    schema: &str,
    settings: String,
) -> anyhow::Result<Outcome> {
    let state = Arc::new(State {
        enqueued: AtomicU64::new(0),
        done: AtomicU64::new(0),
        pickup: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3)?),
    });
    let worker = Arc::new(
        crate::graphile::options(schema, args.concurrency, pool)
            .add_extension(Shared(state.clone()))
            .define_job::<Job>()
            .init()
            .await?,
    );
    let w = worker.clone();
    let mut running = tokio::spawn(async move { w.run().await });
    let mut producer = tokio::spawn(produce(worker.create_utils(), args.rate, state.clone()));
    // A producer or worker that stops would leave the figures meaningless: fail.
    let figures = tokio::select! {
        f = phases(args, pool, schema, &state) => f,
        r = &mut producer => Err(match r {
            Ok(Err(e)) => e.context("the producer failed"),
            other => anyhow::anyhow!("the producer stopped: {other:?}"),
        }),
        r = &mut running => Err(anyhow::anyhow!("the worker exited during the phases: {r:?}")),
    };
    producer.abort();
    worker.request_shutdown();
    // Let it stop before the schema is dropped (unless the select saw it end).
    if !running.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
    }
    let bytes = serde_json::to_string(&Job::now())?.len();
    let settings = format!(
        "{settings}, rate={}/s, phase={} s, enqueue=WorkerUtils::add_jobs every {TICK:?} \
         (what the rate owes, at most {MOST_PER_TICK}), handler sleeps 1 ms, payload \
         {bytes} bytes of JSON; pickup = enqueue stamp to handler start (graphile_worker \
         does not expose its claim time)",
        args.rate, args.phase_secs
    );
    Ok(Outcome::rows(figures?, settings))
}

/// Adds what `rate` owes every [`TICK`], in one call.
async fn produce(utils: WorkerUtils, rate: u64, state: Arc<State>) -> anyhow::Result<()> {
    let spec = JobSpec::default();
    let start = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let owed = u64::try_from(start.elapsed().as_millis())? * rate / 1000;
        let sent = state.enqueued.load(Ordering::Relaxed);
        let n = owed.saturating_sub(sent).min(MOST_PER_TICK);
        if n == 0 {
            continue;
        }
        let jobs: Vec<_> = (0..n).map(|_| (Job::now(), &spec)).collect();
        utils.add_jobs(&jobs).await?;
        state.enqueued.fetch_add(n, Ordering::Relaxed);
    }
}

/// The three phases and their figures.
async fn phases(
    args: &Args,
    pool: &PgPool,
    schema: &str,
    state: &State,
) -> anyhow::Result<Vec<Figure>> {
    let rate = args.rate;
    let mut rows = Vec::new();
    for name in PHASES {
        // A transaction with an id, held: vacuum keeps every row dead since it began.
        let held = if name == "idle-in-tx" {
            let mut c = sqlx::PgConnection::connect(&args.postgres_url).await?;
            sqlx::raw_sql("BEGIN; SELECT txid_current();")
                .execute(&mut c)
                .await?;
            Some(c)
        } else {
            None
        };
        state.pickup.lock().expect("histogram").reset();
        let samples = sample(state, args.phase_secs).await;
        if let Some(c) = held {
            c.close().await?;
        }
        let [p50, p99] = {
            let h = state.pickup.lock().expect("histogram");
            [0.5, 0.99].map(|q| {
                if h.is_empty() {
                    f64::NAN
                } else {
                    as_f64(h.value_at_quantile(q)) / 1000.0
                }
            })
        };
        let (mean, min) = rates(&samples);
        let backlog = samples.last().map_or(0, |s| s.1.saturating_sub(s.2));
        let mut figures = vec![
            ("done/s mean", mean, "jobs/s"),
            ("done/s min 5 s", min, "jobs/s"),
            ("pickup p50", p50, "ms"),
            ("pickup p99", p99, "ms"),
            ("backlog at end", as_f64(backlog), "jobs"),
        ];
        if name == "recovery" {
            let slots = u64::try_from(args.concurrency)?;
            figures.push((
                "backlog gone after",
                drained_after(&samples, rate, slots),
                "s",
            ));
        }
        let (dead, bytes) = jobs_table(pool, schema).await?;
        figures.push(("jobs dead rows", as_f64(dead), "rows"));
        figures.push(("jobs size", as_f64(bytes) / 1e6, "MB"));
        rows.extend(figures.into_iter().map(|(what, value, unit)| Figure {
            scenario: format!("phases {rate}/s, {name}: {what}"),
            value,
            unit,
        }));
    }
    Ok(rows)
}

/// (seconds since the phase began, enqueued, done) once a second.
async fn sample(state: &State, seconds: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for s in 0..=seconds {
        tick.tick().await;
        out.push((
            s,
            state.enqueued.load(Ordering::Relaxed),
            state.done.load(Ordering::Relaxed),
        ));
    }
    out
}

/// Mean completions per second over the phase, and the lowest over its whole
/// [`WINDOW`]-second windows (the mean when the phase is shorter than one).
fn rates(samples: &[(u64, u64, u64)]) -> (f64, f64) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return (0.0, 0.0);
    };
    let mean = as_f64(last.2 - first.2) / as_f64((last.0 - first.0).max(1));
    let min = samples
        .windows(WINDOW + 1)
        .step_by(WINDOW)
        .map(|w| as_f64(w[WINDOW].2 - w[0].2) / as_f64(WINDOW as u64))
        .fold(f64::INFINITY, f64::min);
    (mean, if min.is_finite() { min } else { mean })
}

/// Seconds into the phase until the backlog was down to a tenth of a second's jobs
/// plus the slots (what is in flight), or the phase's length when it never was.
fn drained_after(samples: &[(u64, u64, u64)], rate: u64, slots: u64) -> f64 {
    samples
        .iter()
        .find(|(_, enq, done)| enq.saturating_sub(*done) <= rate / 10 + slots)
        .or(samples.last())
        .map_or(0.0, |s| as_f64(s.0))
}

/// Dead rows and total size (with indexes and TOAST) of graphile_worker's jobs table.
async fn jobs_table(pool: &PgPool, schema: &str) -> anyhow::Result<(u64, u64)> {
    let (dead, bytes): (i64, i64) = sqlx::query_as(
        "SELECT n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables
         WHERE schemaname = $1 AND relname = '_private_jobs'",
    )
    .bind(schema)
    .fetch_one(pool)
    .await?;
    Ok((u64::try_from(dead)?, u64::try_from(bytes)?))
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}
