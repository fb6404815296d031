//! `relayq dead list|retry`: dead jobs, and putting them back.

use relayq_core::{Error as CoreError, JobId, JobState};

use super::{printable, table, time};
use crate::{
    args::QueueArg,
    backend::{self, Use},
    exit,
    report::JobReport,
    spec::{payload_name, shorten},
};

/// `relayq dead ...`.
#[derive(Debug, clap::Subcommand)]
pub enum DeadCommand {
    /// List dead jobs, oldest first.
    List {
        #[command(flatten)]
        queue: QueueArg,
        /// At most this many (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Print JSON: an array of jobs as `relayq job --json` shows them.
        #[arg(long)]
        json: bool,
    },
    /// Put dead jobs back to ready with their attempts again (numbered on from the last): the given ids, or every
    /// dead job of the queue. Dead jobs of a batch stay dead (reviving one could break
    /// the order of its stages); exit code 1 when a given job could not be retried.
    Retry {
        #[command(flatten)]
        queue: QueueArg,
        /// The jobs; all dead jobs of the queue when none is given.
        ids: Vec<i64>,
    },
}

/// Runs the dead subcommand; returns the exit code.
///
/// # Errors
/// No database, a backend failure.
pub async fn run(db: &str, cmd: DeadCommand) -> anyhow::Result<u8> {
    let need = match cmd {
        DeadCommand::List { .. } => Use::Read,
        DeadCommand::Retry { .. } => Use::Existing,
    };
    let backend = backend::open(db, need).await?;
    match cmd {
        DeadCommand::List { queue, limit, json } => {
            let dead = backend.dead_jobs(&queue.queue, limit).await?;
            if json {
                let jobs: Vec<JobReport> = dead.into_iter().map(JobReport::new).collect();
                outln!("{}", serde_json::to_string_pretty(&jobs)?);
                return Ok(exit::OK);
            }
            if dead.is_empty() {
                outln!("no dead jobs in queue {:?}", queue.queue);
                return Ok(exit::OK);
            }
            let mut t = table(["job", "name", "batch", "attempts", "finished", "last error"]);
            for j in &dead {
                t.add_row([
                    j.id.to_string(),
                    payload_name(&j.payload),
                    j.batch.map_or_else(|| "-".into(), |b| b.to_string()),
                    format!("{}/{}", j.attempts, j.max_attempts),
                    j.finished_at.map_or_else(|| "-".into(), time),
                    shorten(
                        &printable(
                            j.last_error
                                .as_deref()
                                .and_then(|e| e.lines().next())
                                .unwrap_or("-"),
                        ),
                        60,
                    ),
                ]);
            }
            outln!("{t}");
            outln!(
                "{} dead job(s); `relayq job ID` shows one with its output",
                dead.len()
            );
        }
        DeadCommand::Retry { queue, ids } => {
            let ids: Vec<JobId> = ids.into_iter().map(JobId).collect();
            let n = backend
                .retry_dead(&queue.queue, (!ids.is_empty()).then_some(&ids[..]))
                .await?;
            outln!("{n} dead job(s) of queue {:?} are ready again", queue.queue);
            if ids.is_empty() {
                // Say what stayed, rather than let "0 ready again" look like no dead jobs.
                let left = backend.dead_jobs(&queue.queue, 1000).await?;
                if !left.is_empty() {
                    let in_batches = left.iter().filter(|j| j.batch.is_some()).count();
                    let more = if left.len() == 1000 { " (or more)" } else { "" };
                    eprintln!(
                        "{}{more} dead job(s) stay dead: {in_batches} in batches (reviving one \
                         could break the order of its stages: run the plan again instead), {} \
                         whose dedupe key another unfinished job holds; `relayq dead list -q {}` \
                         lists them",
                        left.len(),
                        left.len() - in_batches,
                        queue.queue
                    );
                }
            }
            if !ids.is_empty() && n < ids.len() as u64 {
                // Say why each job that stayed did.
                for &id in &ids {
                    let why = match backend.job(&queue.queue, id).await {
                        Err(CoreError::NotFound { .. }) => "does not exist".to_owned(),
                        Err(e) => return Err(e.into()),
                        Ok(j) if j.state != JobState::Dead && j.state != JobState::Ready => {
                            format!("is {}, not dead", j.state)
                        }
                        Ok(j) if j.state == JobState::Dead && j.batch.is_some() => format!(
                            "is in batch {}: dead jobs of a batch stay dead, as reviving one could break the order of its stages (run the plan again instead)",
                            j.batch.map_or(0, |b| b.0)
                        ),
                        Ok(j) if j.state == JobState::Dead => {
                            "stays dead: another unfinished job holds its dedupe key".to_owned()
                        }
                        Ok(_) => continue,
                    };
                    eprintln!("job {id} {why}");
                }
                return Ok(exit::FAILED);
            }
        }
    }
    Ok(exit::OK)
}
