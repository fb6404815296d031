//! What the three apalis backends share: the handler, the worker set-up and the
//! enqueue loops, all through apalis's own `TaskSink` and `WorkerBuilder`.

use std::sync::Arc;

use apalis::prelude::{BoxDynError, Data, TaskSink, WorkerContext};
use tokio::task::JoinHandle;

use crate::common::{self, BATCH, Payload, Probe};

/// Jobs fetched per poll. apalis's default is 10; its examples (apalis-postgres
/// `examples/basic.rs`, apalis-redis's worker tests) raise it to 100 for throughput,
/// and `Config::batch_size`'s docs say larger batches reduce queue operations.
pub const BATCH_SIZE: usize = 100;

/// The poll interval beside each backend's wake-ups. apalis-core 1.0's `PollWith` /
/// `StreamStrategy` loses wake-ups: it takes one item from the wake-up stream per
/// `poll_next` and ignores whether it was ready, so a worker that consumed a wake-up
/// and then found nothing new sleeps through later ones until its poll timer fires (a
/// run with apalis-postgres's documented 10 s fallback, `examples/pubsub.rs`, showed
/// jobs waiting 5 s). So the fallback bounds the latency, and all three backends poll
/// at 100 ms, the one sub-second interval in apalis 1.0's examples (apalis-sqlite
/// `examples/config.rs`).
pub const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The settings every apalis backend runs with (the backend adds its own).
pub fn settings(concurrency: usize) -> String {
    format!(
        "concurrency={concurrency} (WorkerBuilder::concurrency, i.e. tower ConcurrencyLimit), \
         parallelize=tokio::spawn (README: .concurrency(n).parallelize(tokio::spawn)), \
         batch_size={BATCH_SIZE}, lock_tasks=false (as in apalis-postgres examples/basic.rs; \
         fetching already marks the job Queued and locked by the worker), \
         persist_results=true (default; records each job as Done), heartbeat_interval=30s \
         (default), codec=JSON (default)"
    )
}

/// The no-op handler.
pub async fn handle(job: Payload, probe: Data<Arc<Probe>>) -> Result<(), BoxDynError> {
    probe.handle(&job).await;
    Ok(())
}

/// Builds a worker on `$backend` with `$concurrency` and the probe, and spawns it;
/// evaluates to its context (to stop it) and its task.
macro_rules! spawn_worker {
    ($backend:expr, $concurrency:expr, $probe:expr) => {{
        use ::apalis::prelude::*;
        let ctx = WorkerContext::new(&$crate::common::unique("bench_worker"));
        let worker = WorkerBuilder::new(&ctx)
            .backend($backend)
            .data($probe.clone())
            .concurrency($concurrency)
            .parallelize(tokio::spawn)
            .build($crate::apalis_shared::handle);
        (ctx, tokio::spawn(worker.run()))
    }};
}
pub(crate) use spawn_worker;

/// Stops a worker and waits until it has exited (its results flushed).
pub async fn stop(
    ctx: &WorkerContext,
    task: JoinHandle<Result<(), apalis::prelude::WorkerError>>,
) -> anyhow::Result<()> {
    ctx.stop()?;
    task.await??;
    Ok(())
}

/// Scenario enqueue-single: `push` from 8 tasks, each on its own clone of the sink.
pub async fn enqueue_single<S, K>(
    n: usize,
    sink: &S,
) -> anyhow::Result<(usize, std::time::Duration)>
where
    S: TaskSink<Payload, K> + Clone + Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    common::from_tasks(n, |count| {
        let mut sink = sink.clone();
        async move {
            for _ in 0..count {
                sink.push(Payload::now(0)).await?;
            }
            Ok(())
        }
    })
    .await
}

/// Pushes `jobs` with `push_bulk`, [`BATCH`] at a time.
pub async fn push_bulk<S, K>(sink: &mut S, jobs: Vec<Payload>) -> anyhow::Result<()>
where
    S: TaskSink<Payload, K>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        sink.push_bulk(jobs.by_ref().take(BATCH).collect()).await?;
    }
    Ok(())
}

/// Scenario latency's enqueue side: one push per tick, each on a clone of the sink.
pub async fn steady<S, K>(n: usize, sink: &S) -> anyhow::Result<()>
where
    S: TaskSink<Payload, K> + Clone + Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    common::steady(n, |job| {
        let mut sink = sink.clone();
        async move { Ok(sink.push(job).await?) }
    })
    .await
}

/// Waits for the probe, failing at once if the worker exits first.
pub async fn wait(
    probe: &Probe,
    task: &mut JoinHandle<Result<(), apalis::prelude::WorkerError>>,
) -> anyhow::Result<()> {
    tokio::select! {
        r = probe.wait() => r,
        r = task => anyhow::bail!("the worker exited before every job was handled: {r:?}"),
    }
}

/// The body of a backend's `measure`: runs `$args.scenario` with `$sink` enqueueing
/// and a worker polling `$backend` (evaluated once, only when a worker is needed).
/// Evaluates to `anyhow::Result<(Outcome, usize)>`: the outcome and the jobs enqueued.
macro_rules! measure {
    ($args:expr, $sink:expr, $backend:expr, $settings:expr) => {{
        use std::time::Instant;
        use $crate::{
            Scenario, Unsupported,
            apalis_shared::{enqueue_single, push_bulk, spawn_worker, steady, stop, wait},
            common::{BATCH, Outcome, Payload, Probe},
        };
        let (args, mut sink, settings) = ($args, $sink, $settings);
        let jobs = |n: usize| -> Vec<Payload> { (0..n).map(|_| Payload::now(0)).collect() };
        match args.scenario {
            Scenario::EnqueueSingle => {
                let (n, took) = enqueue_single(args.jobs, &sink).await?;
                Ok((Outcome::rate(n, took, settings), n))
            }
            Scenario::EnqueueBatch => {
                let n = args.jobs.max(BATCH) / BATCH * BATCH;
                let all = jobs(n);
                let start = Instant::now();
                push_bulk(&mut sink, all).await?;
                Ok((Outcome::rate(n, start.elapsed(), settings), n))
            }
            Scenario::Drain => {
                let n = args.jobs;
                push_bulk(&mut sink, jobs(n)).await?;
                let probe = Probe::new(n, false, false)?;
                let start = Instant::now();
                let (ctx, mut task) = spawn_worker!($backend, args.concurrency, probe);
                wait(&probe, &mut task).await?;
                stop(&ctx, task).await?;
                Ok((Outcome::rate(n, start.elapsed(), settings), n))
            }
            Scenario::Latency => {
                let n = args.jobs;
                let probe = Probe::new(n, true, false)?;
                let (ctx, mut task) = spawn_worker!($backend, args.concurrency, probe);
                // Idle workers: registered, listening and polling before the first job.
                tokio::time::sleep($crate::common::IDLE).await;
                steady(n, &sink).await?;
                wait(&probe, &mut task).await?;
                stop(&ctx, task).await?;
                Ok((Outcome::latency(&probe, settings)?, n))
            }
            Scenario::Groups => Err(Unsupported(
                "apalis has no per-group serial execution (no queue_name / group key); \
                 the groups scenario is graphile_worker only",
            )
            .into()),
            Scenario::Phases => Err(Unsupported(
                "the phases scenario is implemented for graphile_worker only",
            )
            .into()),
        }
    }};
}
pub(crate) use measure;
