//! `relayq status [QUEUE] [--batch ID | --batches N]`: counts per state, what runs
//! now, and the newest batches' (or one batch's) progress per stage.

use relayq_core::{Backend, Batch, BatchId, BatchProgress, JobState, QueueStats, RunningJob};
use serde::Serialize;

use super::{table, time};
use crate::{
    backend::{self, Use},
    exit,
    spec::payload_name,
};

/// Arguments of `relayq status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The queue.
    #[arg(env = "RELAYQ_QUEUE", default_value = "default")]
    pub queue: String,
    /// Show this batch's progress per stage (instead of the newest batches').
    #[arg(long)]
    pub batch: Option<i64>,
    /// How many of the newest batches to show.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batches: u32,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Status {
    stats: QueueStats,
    running: Vec<Running>,
    batches: Vec<BatchProgress>,
}

#[derive(Serialize)]
struct Running {
    #[serde(flatten)]
    job: RunningJob,
    name: String,
}

/// Prints the status; returns the exit code.
///
/// # Errors
/// No database, an unknown batch, a backend failure.
pub async fn run(db: &str, args: StatusArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    let queue = args.queue.as_str();
    let stats = backend.queue_stats(queue).await?;
    let mut running = Vec::new();
    for job in backend.running(queue).await? {
        running.push(Running {
            name: name_of(&*backend, queue, &job).await,
            job,
        });
    }
    let batches = match args.batch {
        Some(id) => vec![
            backend
                .batch_progress(&Batch {
                    queue: queue.to_owned(),
                    id: BatchId(id),
                })
                .await?,
        ],
        None => backend.batches(queue, args.batches).await?,
    };
    let status = Status {
        stats,
        running,
        batches,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_text(&status);
    }
    Ok(exit::OK)
}

async fn name_of(backend: &dyn Backend, queue: &str, job: &RunningJob) -> String {
    // The job may finish between the two reads; then there is no name to show.
    backend
        .job(queue, job.id)
        .await
        .map_or_else(|_| "-".to_owned(), |info| payload_name(&info.payload))
}

fn print_text(s: &Status) {
    let st = &s.stats;
    outln!(
        "queue {:?}: {} jobs; paused: {}; max running: {}",
        st.queue,
        st.total(),
        if st.paused { "yes" } else { "no" },
        st.max_running
            .map_or_else(|| "none".into(), |m| m.to_string())
    );
    let mut counts = table(["state", "jobs"]);
    for state in JobState::ALL {
        counts.add_row([state.to_string(), st.count(state).to_string()]);
    }
    outln!("{counts}");
    if s.running.is_empty() {
        outln!("running now: none");
    } else {
        outln!("running now:");
        let mut t = table(["job", "name", "worker", "attempt", "started", "lease until"]);
        for r in &s.running {
            t.add_row([
                r.job.id.to_string(),
                r.name.clone(),
                r.job.worker.clone(),
                r.job.attempt.to_string(),
                time(r.job.started_at),
                time(r.job.lease_expires_at),
            ]);
        }
        outln!("{t}");
    }
    for b in &s.batches {
        print_batch(b);
    }
}

/// A batch's state and its counts per stage.
pub fn print_batch(b: &BatchProgress) {
    let state = if b.is_finished() {
        "finished"
    } else if b.sealed {
        "in progress"
    } else {
        "open (not sealed)"
    };
    outln!(
        "batch {} of queue {:?}: {state}; on_failure = {}{}",
        b.batch.id,
        b.batch.queue,
        b.on_failure.as_str(),
        if b.failed { "; failed (halted)" } else { "" }
    );
    let mut t = table([
        "stage",
        "pending",
        "running",
        "succeeded",
        "dead",
        "cancelled",
        "total",
    ]);
    for s in &b.stages {
        t.add_row([
            s.stage.to_string(),
            s.pending.to_string(),
            s.running.to_string(),
            s.succeeded.to_string(),
            s.dead.to_string(),
            s.cancelled.to_string(),
            s.total().to_string(),
        ]);
    }
    outln!("{t}");
}
