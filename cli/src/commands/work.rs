//! `relayq work`: a long-running worker that executes queued commands until Ctrl-C or
//! SIGTERM, then shuts down gracefully.

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use relayq_core::worker::Worker;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc::unbounded_channel,
};
use tokio_util::sync::CancellationToken;

use super::time;
use crate::{
    args::{duration, positive_duration},
    backend::Use,
    connect, exit,
    handler::{CommandHandler, EventKind, JobEvent, worker_name},
    progress::format_secs,
};

/// Arguments of `relayq work`.
#[derive(Debug, clap::Args)]
pub struct WorkArgs {
    /// A queue to serve (repeat for several; they are served in turn).
    #[arg(long = "queue", short = 'q', default_value = "default")]
    pub queues: Vec<String>,
    /// How many commands run at once.
    #[arg(long, short = 'c', default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub concurrency: u32,
    /// The worker's name in the execution log (default work@HOST:PID).
    #[arg(long)]
    pub name: Option<String>,
    /// On Ctrl-C or SIGTERM, how long running commands may go on before they are killed
    /// and their jobs released (not counted as attempts) for another worker.
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    pub shutdown_timeout: Duration,
    /// Lease of each claimed job, renewed every third of it while its command runs. A
    /// command whose worker stops renewing (killed, frozen, cut off from the server) is
    /// killed before the lease ends, so it never runs beside the job's next attempt;
    /// a job whose worker died is claimed again once its lease ends.
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    pub lease: Duration,
    /// Finished jobs (succeeded, dead, cancelled) older than this are deleted by the
    /// maintenance pass, which this worker runs on its queues every --maintain-every
    /// (on PostgreSQL and Redis one worker per queue at a time). `relayq prune` does it by
    /// hand.
    #[arg(long, default_value = "7d", value_parser = duration)]
    pub retention: Duration,
    /// How often the maintenance pass runs.
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    pub maintain_every: Duration,
    /// Run no maintenance pass (for a set-up that prunes otherwise, e.g. a cron job
    /// running `relayq prune`).
    #[arg(long, conflicts_with_all = ["retention", "maintain_every"])]
    pub no_maintenance: bool,
    /// Fire no schedule (by default the worker enqueues each due slot of its queues'
    /// schedules, checking about once a second; see `relayq schedule`).
    #[arg(long)]
    pub no_schedules: bool,
    /// Serve the worker's counters (claims, settles by outcome, busy slots, handler
    /// durations, pruning) as Prometheus text at http://ADDR/metrics; loopback only.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// Serves the queues until a signal; returns the exit code.
///
/// # Errors
/// Bad settings, or a database URL that cannot work (a server that does not answer
/// is waited for).
pub async fn run(db: &str, args: WorkArgs) -> anyhow::Result<u8> {
    // Before anything else: a bad address is bad input, reported at once.
    if let Some(addr) = &args.metrics {
        let bound = super::metrics::serve(addr).await?;
        eprintln!("relayq: metrics at http://{bound}/metrics");
    }
    // Listeners made first: a signal while the server is waited for stops the wait.
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let backend = tokio::select! {
        b = connect::open_waiting(db, Use::Create) => b?,
        _ = interrupt.recv() => return Ok(exit::INTERRUPTED),
        _ = term.recv() => return Ok(exit::OK),
    };
    let name = args.name.clone().unwrap_or_else(|| worker_name("work"));
    let (tx, mut rx) = unbounded_channel();
    let worker = Worker::builder(backend, args.queues.clone())
        .name(name.clone())
        .concurrency(args.concurrency)
        .shutdown_timeout(args.shutdown_timeout)
        .lease(args.lease)
        .maintenance(args.maintain_every, args.retention);
    let worker = if args.no_maintenance {
        worker.no_maintenance()
    } else {
        worker
    };
    let worker = if args.no_schedules {
        worker.no_schedules()
    } else {
        worker
    };
    let worker = worker
        .handler(CommandHandler::new(Some(tx), CancellationToken::new()).into_worker_handler())
        .build()
        .map_err(|e| crate::exit::usage(e.to_string()))?;
    let worker = worker.spawn();
    outln!(
        "{} worker {name} serving {:?} with {} slots; Ctrl-C or SIGTERM stops it",
        time(Utc::now()),
        args.queues,
        args.concurrency
    );
    let why = loop {
        tokio::select! {
            Some(ev) = rx.recv() => print_event(&ev),
            _ = interrupt.recv() => break "SIGINT",
            _ = term.recv() => break "SIGTERM",
        }
    };
    outln!(
        "{} {why}: stopping; running commands get up to {} to finish",
        time(Utc::now()),
        crate::words::duration(args.shutdown_timeout)
    );
    let shutdown = worker.shutdown();
    tokio::pin!(shutdown);
    let report = loop {
        tokio::select! {
            r = &mut shutdown => break r?,
            Some(ev) = rx.recv() => print_event(&ev),
        }
    };
    while let Ok(ev) = rx.try_recv() {
        print_event(&ev);
    }
    outln!(
        "{} stopped: {} claimed, {} succeeded, {} failed attempts, {} released, {} lease lost, {} not settled",
        time(Utc::now()),
        report.claimed,
        report.succeeded,
        report.failed,
        report.released,
        report.lease_lost,
        report.lost
    );
    Ok(exit::OK)
}

fn print_event(ev: &JobEvent) {
    let who = format!(
        "job {} of {:?} (attempt {}/{})",
        ev.job, ev.queue, ev.attempt, ev.max_attempts
    );
    let what = match &ev.kind {
        EventKind::Started { command } => format!(
            "start   {who} {}: {}",
            super::printable(&ev.name),
            super::printable(command)
        ),
        EventKind::Ended { ending, elapsed } if ending.success() => {
            format!("ok      {who} in {}", format_secs(*elapsed))
        }
        EventKind::Ended { ending, elapsed } => {
            format!("failed  {who}: {ending} after {}", format_secs(*elapsed))
        }
        EventKind::BadPayload { error } => format!("failed  {who}: {error}"),
    };
    outln!("{} {what}", time(Utc::now()));
}
