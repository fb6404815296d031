//! `relayq run PLAN.toml`: validate the plan, enqueue it as one sealed batch, run it on
//! local workers with live progress, then print the summary from the execution log.

use std::{
    io::IsTerminal,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use relayq_core::{
    Backend, Batch, BatchId, BatchProgress, Error as CoreError, Event, EventKind, OrderBarrierExt,
    WaitFor, worker::Worker,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{
        broadcast,
        mpsc::{UnboundedReceiver, unbounded_channel},
    },
};
use tokio_util::sync::CancellationToken;

use crate::{
    args::{QueueArg, positive_duration},
    backend::{self, Use},
    exit,
    handler::{CommandHandler, JobEvent, worker_name},
    plan::{self, Plan},
    progress::Progress,
    report::{JobReport, RunReport},
};

/// Arguments of `relayq run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The plan: a TOML file of [[job]] tables (see `relayq help run`).
    pub plan: PathBuf,
    /// How many commands run at once (the local worker's slots).
    #[arg(long, short = 'w', default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub workers: u32,
    #[command(flatten)]
    pub queue: QueueArg,
    /// Give up after this long: cancel what is left and exit with 124.
    #[arg(long, value_parser = positive_duration)]
    pub timeout: Option<Duration>,
    /// Also write the report (every job with its attempts and times) as JSON here.
    #[arg(long, value_name = "FILE")]
    pub report_json: Option<PathBuf>,
    /// Plain progress lines even on a terminal: one per job as it ends, one per stage.
    #[arg(long)]
    pub plain: bool,
    /// Print the table and timeline of every job even for a plan of more than 50
    /// (otherwise: totals per stage, then the jobs that did not succeed).
    #[arg(long)]
    pub full: bool,
}

/// Plans up to this many jobs get a row and a timeline line per job at the end.
const FULL_UP_TO: usize = 50;

/// Every job: the table, the timeline, the failures, the totals.
fn print_full(report: &RunReport) {
    outln!();
    outln!("{}", report.table());
    outln!();
    out!("{}", report.timeline(50));
    let failures = report.failures();
    if !failures.is_empty() {
        outln!();
        out!("{failures}");
    }
    outln!();
    outln!("{}", report.totals());
}

/// A big run: per stage totals, then failures first, then the totals.
fn print_summary(report: &RunReport) {
    outln!();
    outln!("{}", report.stage_table());
    let failed = report.unsuccessful_table(FULL_UP_TO);
    if !failed.is_empty() {
        outln!();
        outln!("{failed}");
    }
    let failures = report.failures_of(10);
    if !failures.is_empty() {
        outln!();
        out!("{failures}");
    }
    outln!();
    outln!("{}", report.totals());
    outln!(
        "({}: every job's row and timeline with --full; every job with its attempts in --report-json)",
        crate::words::plural(report.jobs.len(), "job")
    );
}

/// How the wait for the batch ended.
enum End {
    Finished,
    TimedOut,
    Interrupted,
}

/// Runs the plan; returns the exit code.
///
/// # Errors
/// A bad plan (nothing is enqueued then), or a backend failure.
pub async fn run(db: &str, args: RunArgs) -> anyhow::Result<u8> {
    let plan = plan::load(&args.plan)?;
    let queue = args.queue.queue.clone();
    // Checked with the core's rules before anything is stored; the batch id is set
    // once the batch exists.
    let mut jobs = plan.new_jobs(&queue, BatchId(0))?;
    let backend = backend::open(db, Use::RunInProcess).await?;
    for (key, limit) in &plan.key_limits {
        backend
            .set_key_limit(&queue, key.as_deref(), Some(*limit))
            .await
            .context("cannot set the plan's key limits")?;
    }
    if let Some(rate) = plan.rate {
        backend
            .update_queue(&queue, relayq_core::QueueUpdate::default().rate(Some(rate)))
            .await
            .context("cannot set the plan's rate")?;
    }

    let new_batch = relayq_core::NewBatch::new(&queue)
        .on_failure(plan.on_failure)
        .after_failure(plan.after_failure)
        .name(&plan.name);
    let batch = backend
        .open_batch_with(&new_batch)
        .await
        .context("cannot open a batch")?;
    for job in &mut jobs {
        job.batch = Some(batch.id);
    }
    // One call: the whole plan is stored, or nothing.
    let traced = relayq_core::Traced::new(backend.clone());
    let enqueued = match relayq_core::Enqueue::enqueue(&traced, jobs).await {
        Ok(ids) => ids,
        Err(e) => {
            let _ = backend.seal(&batch).await;
            return Err(e)
                .context("cannot enqueue the plan; no job was stored (the empty batch is sealed)");
        }
    };
    backend
        .seal(&batch)
        .await
        .context("cannot seal the batch")?;

    let stop = CancellationToken::new();
    let (tx, mut rx) = unbounded_channel();
    let name = worker_name("run");
    let worker = Worker::builder(backend.clone(), [queue.clone()])
        .name(name.clone())
        .concurrency(args.workers)
        // Only an interrupted or timed-out run stops with commands still running, and
        // those are being killed: no need to wait long for them.
        .shutdown_timeout(Duration::from_secs(5))
        .handler(CommandHandler::new(Some(tx), stop.clone()).into_worker_handler())
        .build()?
        .spawn();

    outln!(
        "relayq run {}: {} in {}; batch {} {:?} of queue {queue:?}; on_failure = {}; {} worker slots ({name})",
        plan.file,
        crate::words::plural(plan.jobs.len(), "job"),
        crate::words::plural(plan.stages().len(), "stage"),
        batch.id,
        plan.name,
        plan.on_failure.as_str(),
        args.workers,
    );
    let bars = !args.plain && std::io::stdout().is_terminal();
    let mut progress = Progress::new(&plan.stages(), bars);
    let end = watch(
        &backend,
        &batch,
        &mut progress,
        &mut rx,
        &stop,
        args.timeout,
    )
    .await?;
    worker.shutdown().await.context("worker shutdown")?;
    while let Ok(ev) = rx.try_recv() {
        progress.event(&ev);
    }
    if let Ok(p) = backend.batch_progress(&batch).await {
        progress.batch(&p);
    }
    progress.finish();

    let report = report(&backend, &batch, &plan, &enqueued).await?;
    if args.full || report.jobs.len() <= FULL_UP_TO {
        print_full(&report);
    } else {
        print_summary(&report);
    }
    if let Some(path) = &args.report_json {
        report.write_json(path)?;
    }
    Ok(match end {
        End::Interrupted => exit::INTERRUPTED,
        End::TimedOut => exit::TIMEOUT,
        End::Finished if report.unsuccessful() > 0 => exit::FAILED,
        End::Finished => exit::OK,
    })
}

/// Shows progress until the batch is finished (via `OrderBarrier::wait`), the timeout
/// passes or Ctrl-C; in the last two cases the batch is cancelled and running commands
/// are killed.
async fn watch(
    backend: &Arc<dyn Backend>,
    batch: &Batch,
    progress: &mut Progress,
    events: &mut UnboundedReceiver<JobEvent>,
    stop: &CancellationToken,
    timeout: Option<Duration>,
) -> anyhow::Result<End> {
    let wait = async {
        loop {
            let chunk = timeout.unwrap_or(Duration::from_secs(3600));
            match backend.wait(batch, WaitFor::Batch, chunk).await {
                Err(CoreError::Timeout { .. }) if timeout.is_none() => {}
                other => return other,
            }
        }
    };
    tokio::pin!(wait);
    // Counts are re-read when a job of the queue finishes (where the backend tells), at
    // most every 50 ms, and every 200 ms anyway: counting is O(batch), and a batch of
    // short commands finishes jobs far more often than anyone reads the bars.
    const READ_GAP: Duration = Duration::from_millis(50);
    let mut last_read: Option<Instant> = None;
    let mut finished = backend.subscribe();
    // One listener for the whole wait: a Ctrl-C that arrives while an arm below is busy
    // is kept for the next turn (a fresh `ctrl_c()` per turn would miss it).
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch Ctrl-C (SIGINT)")?;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let end = loop {
        tokio::select! {
            res = &mut wait => match res {
                Ok(p) => { progress.batch(&p); break End::Finished }
                Err(CoreError::Timeout { .. }) => {
                    progress.line(&format!(
                        "timed out after {}: cancelling the batch",
                        crate::words::duration(timeout.unwrap_or_default())
                    ));
                    break End::TimedOut;
                }
                Err(e) => return Err(e).context("waiting for the batch"),
            },
            Some(ev) = events.recv() => progress.event(&ev),
            () = next_finished(&mut finished, &batch.queue),
                if last_read.is_none_or(|at| at.elapsed() >= READ_GAP) => {
                last_read = Some(Instant::now());
                if let Ok(p) = backend.batch_progress(batch).await {
                    progress.batch(&p);
                }
            }
            _ = tick.tick() => {
                last_read = Some(Instant::now());
                if let Ok(p) = backend.batch_progress(batch).await {
                    progress.batch(&p);
                }
            }
            _ = interrupt.recv() => {
                progress.line("interrupted: cancelling the batch and killing running commands");
                break End::Interrupted;
            }
        }
    };
    if !matches!(end, End::Finished) {
        // Cancel first, so the running jobs end `cancelled` (their leases revoked), not
        // failed by the kill that follows.
        let cancelled = backend.cancel_batch(batch).await;
        stop.cancel();
        cancelled.context("cannot cancel the batch")?;
    }
    Ok(end)
}

/// `1 job`, `3 jobs`.
/// Waits for a `Finished` event of `queue` (or a lag, which may hide one); never returns
/// when the backend sends no events.
async fn next_finished(events: &mut Option<broadcast::Receiver<Event>>, queue: &str) {
    let Some(rx) = events.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(ev) if ev.concerns(queue, EventKind::Finished) => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => {
                *events = None;
                return std::future::pending().await;
            }
        }
    }
}

/// Reads every job of the run back from the execution log.
async fn report(
    backend: &Arc<dyn Backend>,
    batch: &Batch,
    plan: &Plan,
    enqueued: &[relayq_core::Enqueued],
) -> anyhow::Result<RunReport> {
    let progress: BatchProgress = backend.batch_progress(batch).await?;
    let mut jobs = Vec::with_capacity(enqueued.len());
    for e in enqueued {
        let info = backend
            .job(&batch.queue, e.id)
            .await
            .with_context(|| format!("cannot read job {}", e.id))?;
        jobs.push(JobReport::new(info));
    }
    Ok(RunReport {
        queue: batch.queue.clone(),
        batch: batch.id,
        on_failure: plan.on_failure,
        halted: progress.failed,
        jobs,
    })
}
