//! `relayq job ID`: one job with its attempt log, the output a successful command
//! left, and the last error (with the failed command's output).

use relayq_core::JobId;

use super::{table, time};
use crate::{
    args::QueueArg,
    backend::{self, Use},
    exit,
    report::JobReport,
};

/// Arguments of `relayq job`.
#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The job.
    pub id: i64,
    #[command(flatten)]
    pub queue: QueueArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Shows the job; returns the exit code.
///
/// # Errors
/// No database, an unknown job, a backend failure.
pub async fn run(db: &str, args: JobArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    let job = JobReport::new(backend.job(&args.queue.queue, JobId(args.id)).await?);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(exit::OK);
    }
    outln!(
        "job {} of queue {:?}: {}",
        job.id,
        args.queue.queue,
        job.state
    );
    outln!("  name:     {}", job.name);
    outln!("  command:  {}", job.command);
    if let Some(stage) = job.stage {
        outln!("  stage:    {stage}");
    }
    if let Some(group) = &job.group {
        outln!("  group:    {group}");
    }
    outln!("  enqueued: {}", time(job.created_at));
    if job.attempts.is_empty() {
        outln!("  attempts: none yet (of {})", job.max_attempts);
    } else {
        let mut t = table(["attempt", "worker", "start", "end", "outcome", "error"]);
        for a in &job.attempts {
            t.add_row([
                a.attempt.to_string(),
                a.worker.clone(),
                time(a.started_at),
                a.ended_at.map_or_else(|| "-".into(), time),
                a.outcome.to_string(),
                a.error
                    .as_deref()
                    .and_then(|e| e.lines().next())
                    .unwrap_or("")
                    .to_owned(),
            ]);
        }
        outln!("{t}");
    }
    if let Some(out) = job.attempts.iter().rev().find_map(|a| a.output.as_deref()) {
        outln!("output (last 64 KiB):");
        for line in out.lines() {
            outln!("    {line}");
        }
    }
    if let Some(err) = &job.last_error {
        outln!("last error:");
        for line in err.lines() {
            outln!("    {line}");
        }
    }
    Ok(exit::OK)
}
