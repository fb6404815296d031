//! `relayq status [-q QUEUE] [--batch ID | --batches N] [--all]`: counts per state,
//! what runs now, and the newest batches' (or one batch's) progress per stage; or with
//! `--all`, the counts of every queue in use.

use chrono::{DateTime, Utc};
use relayq_core::{Backend, Batch, BatchId, BatchProgress, JobState, QueueStats, RunningJob};
use serde::Serialize;

use super::{table, time};
use crate::{
    args::QueueArg,
    backend::{self, Use},
    counts::Counts,
    exit,
    spec::payload_name,
};

/// Arguments of `relayq status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub queue: QueueArg,
    /// The queue, as a word: the older form of --queue, kept for scripts.
    #[arg(hide = true, conflicts_with = "queue")]
    pub queue_word: Option<String>,
    /// One line of counts for every queue in use, instead of one queue's details.
    #[arg(long, conflicts_with_all = ["batch", "queue", "queue_word"])]
    pub all: bool,
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
    stats: Stats,
    running: Vec<Running>,
    batches: Vec<BatchProgress>,
    /// The workers that beat for the queue in the last hour (SPEC M9).
    workers: Vec<relayq_core::WorkerSeen>,
    /// Its limit keys in use or with a limit (SPEC K7).
    keys: relayq_core::KeyLimits,
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
    let backend = backend::open(db, Use::Read).await?;
    if args.all {
        return all(&*backend, args.json).await;
    }
    let queue = args.queue_word.as_deref().unwrap_or(&args.queue.queue);
    let stats = Stats::from(backend.queue_stats(queue).await?);
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
    let workers = backend.workers(queue).await?;
    let keys = backend.key_limits(queue).await?;
    let status = Status {
        stats,
        running,
        batches,
        workers,
        keys,
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

/// A queue's settings and counts, every state present (zero included) in JSON.
#[derive(Serialize)]
struct Stats {
    queue: String,
    paused: bool,
    max_running: Option<u32>,
    total: u64,
    counts: Counts,
    /// When the longest-waiting claimable job became claimable, and its wait in
    /// seconds by this machine's clock; null when none waits.
    oldest_ready: Option<DateTime<Utc>>,
    oldest_ready_seconds: Option<f64>,
    /// The rate limit as text (`10/1s`, `100/1s burst 5`), null when none (SPEC K8).
    rate: Option<String>,
    /// When the rate allows the next start, when that is not now (SPEC K11).
    rate_next: Option<DateTime<Utc>>,
}

impl From<QueueStats> for Stats {
    fn from(s: QueueStats) -> Self {
        Self {
            oldest_ready: s.oldest_ready,
            oldest_ready_seconds: s.oldest_ready_age(Utc::now()).map(|d| d.as_secs_f64()),
            total: s.total(),
            counts: Counts::of(&s),
            queue: s.queue,
            paused: s.paused,
            max_running: s.max_running,
            rate: s.rate.map(|r| r.to_string()),
            rate_next: s.rate_next,
        }
    }
}

/// `status --all`: a row per queue in use.
async fn all(backend: &dyn Backend, json: bool) -> anyhow::Result<u8> {
    let mut rows = Vec::new();
    for queue in backend.queues().await? {
        rows.push(Stats::from(backend.queue_stats(&queue).await?));
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(exit::OK);
    }
    if rows.is_empty() {
        outln!("no queue holds a job yet");
        return Ok(exit::OK);
    }
    let mut header = vec!["queue".to_owned(), "paused".to_owned(), "limit".to_owned()];
    header.extend(JobState::ALL.iter().map(ToString::to_string));
    let mut t = table(header);
    for s in &rows {
        let mut row = vec![
            s.queue.clone(),
            if s.paused { "yes" } else { "no" }.to_owned(),
            s.max_running
                .map_or_else(|| "-".to_owned(), |m| m.to_string()),
        ];
        row.extend(JobState::ALL.iter().map(|&st| s.counts.get(st).to_string()));
        t.add_row(row);
    }
    outln!("{t}");
    Ok(exit::OK)
}

/// Each limit key with running jobs, a limit or rate of its own, or a rate that
/// allows no start now (SPEC K7, K14); the rate columns only when a key has a rate.
fn print_keys(keys: &relayq_core::KeyLimits) {
    if let Some(n) = keys.default {
        outln!("every limit key: at most {n} running");
    }
    if let Some(r) = keys.default_rate {
        outln!("every limit key: at most {r} starts");
    }
    if keys.keys.is_empty() {
        return;
    }
    let rated = keys.keys.iter().any(|k| k.rate.is_some());
    let mut head = vec!["limit key", "running", "limit"];
    if rated {
        head.extend(["rate", "next start"]);
    }
    let mut t = table(head);
    for k in &keys.keys {
        let limit = k.limit.map_or_else(|| "none".to_owned(), |n| n.to_string());
        let mut row = vec![k.key.clone(), k.running.to_string(), limit];
        if rated {
            row.push(k.rate.map_or_else(|| "none".to_owned(), |r| r.to_string()));
            row.push(k.rate_next.map_or_else(
                || "now".to_owned(),
                |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            ));
        }
        t.add_row(row);
    }
    outln!("{t}");
}

fn print_text(s: &Status) {
    let st = &s.stats;
    outln!(
        "queue {:?}: {}; paused: {}; max running: {}",
        st.queue,
        crate::words::plural(st.total, "job"),
        if st.paused { "yes" } else { "no" },
        st.max_running
            .map_or_else(|| "none".into(), |m| m.to_string())
    );
    let mut counts = table(["state", "jobs"]);
    for state in JobState::ALL {
        counts.add_row([state.to_string(), st.counts.get(state).to_string()]);
    }
    outln!("{counts}");
    match st.oldest_ready_seconds {
        Some(secs) => outln!("oldest ready job has waited {secs:.1} s"),
        None => outln!("no job waits to be claimed"),
    }
    if let Some(rate) = &st.rate {
        match st.rate_next {
            Some(at) => outln!(
                "rate: at most {rate}; next start allowed at {}",
                at.format("%H:%M:%S%.3f UTC")
            ),
            None => outln!("rate: at most {rate}; a job may start now"),
        }
    }
    print_workers(s);
    print_keys(&s.keys);
    if s.running.is_empty() {
        outln!("running now: none");
    } else {
        outln!("running now:");
        let mut t = table([
            "job",
            "name",
            "worker",
            "attempt",
            "started",
            "lease until",
            "progress",
        ]);
        for r in &s.running {
            // An earlier attempt's report says nothing of this one.
            let progress = r
                .job
                .progress
                .as_ref()
                .filter(|p| p.attempt == r.job.attempt)
                .map_or_else(|| "-".to_owned(), super::progress);
            t.add_row([
                r.job.id.to_string(),
                r.name.clone(),
                r.job.worker.clone(),
                r.job.attempt.to_string(),
                time(r.job.started_at),
                time(r.job.lease_expires_at),
                progress,
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
    let name = b
        .name
        .as_deref()
        .map_or_else(String::new, |n| format!(" {n:?}"));
    outln!(
        "batch {}{name} of queue {:?}: {state}; on_failure = {}{}",
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

/// Who serves the queue, by the workers' beats (SPEC M9), and a warning when jobs wait
/// and nobody does.
fn print_workers(s: &Status) {
    let now = Utc::now();
    let alive: Vec<_> = s.workers.iter().filter(|w| w.alive(now)).collect();
    let waiting = s.stats.counts.get(JobState::Ready) + s.stats.counts.get(JobState::Retrying);
    if alive.is_empty() {
        if waiting > 0 && !s.stats.paused {
            outln!(
                "warning: no worker serves this queue (none has beaten in the last 15 s), and jobs wait"
            );
        } else {
            outln!("workers: none");
        }
        return;
    }
    let (busy, slots, held) = alive.iter().fold((0, 0, 0), |(b, sl, h), w| {
        (b + w.beat.busy, sl + w.beat.slots, h + w.beat.held)
    });
    outln!(
        "workers: {}, {busy} of {slots} slots busy{}",
        alive.len(),
        if held > 0 {
            format!("; {held} jobs claimed ahead, waiting for a slot (counted running above)")
        } else {
            String::new()
        }
    );
}
