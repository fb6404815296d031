//! graphile_worker 0.14, in a schema of its own (dropped at the end), configured as
//! its guide's "Throughput-oriented worker" (configuration/worker-options.md): local
//! queue, batched completions and failures, 500 ms fallback poll beside LISTEN/NOTIFY.

use std::{sync::Arc, time::Duration, time::Instant};

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, JobSpecBuilder, LocalQueueConfig, TaskHandler, Worker,
    WorkerContext, WorkerOptions, WorkerUtils,
};
// The schema name is ours (`unique`), so formatting it into SQL is safe.
use sqlx::{AssertSqlSafe, PgPool, postgres::PgPoolOptions};
use tokio::task::JoinHandle;

use crate::{
    Args, Scenario,
    common::{self, BATCH, GROUPS, IDLE, Outcome, Payload, Probe, unique},
};

const POLL_INTERVAL: Duration = Duration::from_millis(500);
const BATCH_DELAY: Duration = Duration::from_millis(5);
const LOCAL_QUEUE: usize = 100;
const LOCAL_QUEUE_TTL: Duration = Duration::from_secs(60);

/// The probe, handed to the handler as a worker extension.
#[derive(Clone, Debug)]
struct Shared(Arc<Probe>);

impl TaskHandler for Payload {
    const IDENTIFIER: &'static str = "relayq_bench_noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(Shared(probe)) = ctx.get_ext::<Shared>() {
            probe.handle(&self).await;
        }
        Ok::<(), String>(())
    }
}

pub async fn run(args: &Args) -> anyhow::Result<Outcome> {
    // The worker's pool: its default size (`max_pg_conn`, 20), or more if the
    // concurrency needs it.
    let conns = u32::try_from(args.concurrency.max(16))? + 4;
    let pool = PgPoolOptions::new()
        .max_connections(conns)
        .connect(&args.postgres_url)
        .await?;
    let schema = unique("relayq_bench_gw");
    let settings = format!(
        "concurrency={}, local_queue(size={LOCAL_QUEUE}, ttl={LOCAL_QUEUE_TTL:?}, \
         queue_count=1, no refetch_delay), complete_job_batch_delay={BATCH_DELAY:?}, \
         fail_job_batch_delay={BATCH_DELAY:?}, poll_interval={POLL_INTERVAL:?}, \
         use_notification_delivery=true (default, LISTEN/NOTIFY) (the guide's \
         'Throughput-oriented worker', configuration/worker-options.md), pg pool \
         max_connections={conns} (max_pg_conn's default 20, concurrency+4 above 16)",
        args.concurrency
    );
    let result = match args.scenario {
        Scenario::Phases => crate::graphile_phases::measure(args, &pool, &schema, settings).await,
        _ => {
            let settings = format!(
                "{settings}, enqueue-single=WorkerUtils::add_job, \
                 enqueue-batch=WorkerUtils::add_jobs (one call per 1,000)"
            );
            measure(args, &pool, &schema, settings).await
        }
    };
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await?;
    result
}

/// The guide's throughput-oriented worker on `schema`, as every scenario runs it; the
/// caller adds its extension and job, and initialises it (which migrates the schema).
pub fn options(schema: &str, concurrency: usize, pool: &PgPool) -> WorkerOptions {
    WorkerOptions::default()
        .schema(schema)
        .concurrency(concurrency)
        .poll_interval(POLL_INTERVAL)
        .complete_job_batch_delay(BATCH_DELAY)
        .fail_job_batch_delay(BATCH_DELAY)
        .local_queue(
            LocalQueueConfig::default()
                .with_size(LOCAL_QUEUE)
                .with_ttl(LOCAL_QUEUE_TTL),
        )
        .listen_os_shutdown_signals(false)
        .pg_pool(pool.clone())
}

async fn measure(
    args: &Args,
    pool: &PgPool,
    schema: &str,
    settings: String,
) -> anyhow::Result<Outcome> {
    let n = match args.scenario {
        Scenario::EnqueueBatch => args.jobs.max(BATCH) / BATCH * BATCH,
        Scenario::Groups => common::group_jobs(args.jobs).len(),
        _ => args.jobs,
    };
    anyhow::ensure!(n > 0, "--jobs too small for {:?}", args.scenario);
    let probe = Probe::new(
        n,
        args.scenario == Scenario::Latency,
        args.scenario == Scenario::Groups,
    )?;
    // `init` migrates the fresh schema; none of it is timed.
    let worker = Arc::new(
        options(schema, args.concurrency, pool)
            .add_extension(Shared(probe.clone()))
            .define_job::<Payload>()
            .init()
            .await?,
    );
    let utils = worker.create_utils();
    let default = JobSpec::default();
    let outcome = match args.scenario {
        Scenario::EnqueueSingle => {
            let (n, took) = common::from_tasks(n, |count| {
                let utils = utils.clone();
                async move {
                    for _ in 0..count {
                        utils.add_job(Payload::now(0), JobSpec::default()).await?;
                    }
                    Ok(())
                }
            })
            .await?;
            check(pool, schema, n).await?;
            Outcome::rate(n, took, settings)
        }
        Scenario::EnqueueBatch => {
            let jobs: Vec<_> = (0..n).map(|_| (Payload::now(0), &default)).collect();
            let start = Instant::now();
            add_all(&utils, &jobs).await?;
            let took = start.elapsed();
            check(pool, schema, n).await?;
            Outcome::rate(n, took, settings)
        }
        Scenario::Drain => {
            let jobs: Vec<_> = (0..n).map(|_| (Payload::now(0), &default)).collect();
            add_all(&utils, &jobs).await?;
            let start = Instant::now();
            work(&worker, &probe, async { anyhow::Ok(()) }).await?;
            let took = start.elapsed();
            check(pool, schema, 0).await?;
            Outcome::rate(n, took, settings)
        }
        Scenario::Latency => {
            work(&worker, &probe, async {
                tokio::time::sleep(IDLE).await;
                common::steady(n, |job| {
                    let utils = utils.clone();
                    async move {
                        utils.add_job(job, JobSpec::default()).await?;
                        Ok(())
                    }
                })
                .await
            })
            .await?;
            check(pool, schema, 0).await?;
            Outcome::latency(&probe, settings)?
        }
        Scenario::Groups => {
            let specs: Vec<JobSpec> = (0..GROUPS)
                .map(|g| JobSpecBuilder::new().queue_name(format!("q{g}")).build())
                .collect();
            let jobs: Vec<_> = common::group_jobs(n)
                .into_iter()
                .map(|p| {
                    let spec = &specs[p.g as usize];
                    (p, spec)
                })
                .collect();
            add_all(&utils, &jobs).await?;
            let start = Instant::now();
            work(&worker, &probe, async { anyhow::Ok(()) }).await?;
            let took = start.elapsed();
            probe.check_groups()?;
            check(pool, schema, 0).await?;
            let settings = format!(
                "{settings}, groups={GROUPS} queue_names x {} jobs",
                n / GROUPS
            );
            Outcome::rate(n, took, settings)
        }
        Scenario::Phases => anyhow::bail!("the phases scenario runs in graphile_phases"),
    };
    Ok(outcome)
}

/// Runs the worker while `feed` runs and until every job has been handled, then shuts
/// it down and waits until it has exited (its batched completions flushed).
async fn work(
    worker: &Arc<Worker>,
    probe: &Probe,
    feed: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let w = worker.clone();
    let mut task: JoinHandle<_> = tokio::spawn(async move { w.run().await });
    let waited = async {
        feed.await?;
        tokio::select! {
            r = probe.wait() => r,
            r = &mut task => anyhow::bail!("the worker exited before every job was handled: {r:?}"),
        }
    }
    .await;
    worker.request_shutdown();
    match waited {
        Ok(()) => Ok(task.await??),
        Err(e) => {
            // Give a worker still running a moment to stop before the schema is
            // dropped (one that already ended may have been awaited by the select).
            if !task.is_finished() {
                let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
            }
            Err(e)
        }
    }
}

/// Adds `jobs` with `add_jobs`, [`BATCH`] per call.
async fn add_all(utils: &WorkerUtils, jobs: &[(Payload, &JobSpec)]) -> anyhow::Result<()> {
    for chunk in jobs.chunks(BATCH) {
        utils.add_jobs(chunk).await?;
    }
    Ok(())
}

/// `want` jobs are left in the schema: all of them after an enqueue, none after a
/// worker has run (graphile_worker deletes completed jobs).
async fn check(pool: &PgPool, schema: &str, want: usize) -> anyhow::Result<()> {
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\"._private_jobs"
    )))
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(
        usize::try_from(left)? == want,
        "{left} jobs left, {want} expected"
    );
    Ok(())
}
