//! `relayq wait BATCH_ID`: wait for a stage or a whole batch; `relayq wait --job ID`:
//! for one job.

use std::time::Duration;

use anyhow::Context;
use relayq_core::{
    Batch, BatchId, BatchProgress, Error as CoreError, InspectExt, OrderBarrierExt, WaitFor,
};
use serde::Serialize;

use super::status::print_batch;
use crate::{
    args::{QueueArg, positive_duration},
    backend::{self, Use},
    exit,
};

/// Arguments of `relayq wait`.
#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    /// The batch.
    #[arg(required_unless_present = "job")]
    pub batch: Option<i64>,
    /// Wait for this one job to finish instead of a batch.
    #[arg(long, conflicts_with_all = ["batch", "stage"])]
    pub job: Option<i64>,
    #[command(flatten)]
    pub queue: QueueArg,
    /// Wait for this stage (and every stage below it) instead of the whole batch.
    #[arg(long, allow_negative_numbers = true)]
    pub stage: Option<i32>,
    /// Give up after this long and exit with 124. Default: wait as long as it takes.
    #[arg(long, value_parser = positive_duration)]
    pub timeout: Option<Duration>,
    /// Print the outcome as JSON on stdout: `reached` (false on timeout), `succeeded`
    /// (every job of what was waited for), and the batch's progress per stage.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Outcome<'a> {
    reached: bool,
    succeeded: bool,
    progress: &'a BatchProgress,
}

/// Waits; returns 0 when reached with every job succeeded, 1 when reached with dead or
/// cancelled jobs, 124 on timeout.
///
/// # Errors
/// No database, an unknown batch, a backend failure.
pub async fn run(db: &str, args: WaitArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Read).await?;
    let (Some(id), None) = (args.batch, args.job) else {
        return one_job(&*backend, &args).await;
    };
    let batch = Batch {
        queue: args.queue.queue.clone(),
        id: BatchId(id),
    };
    let target = args.stage.map_or(WaitFor::Batch, WaitFor::Stage);
    let what = match args.stage {
        Some(s) => format!("stage {s} of batch {id}"),
        None => format!("batch {id}"),
    };
    let before = backend.batch_progress(&batch).await?;
    if target == WaitFor::Batch && !before.sealed {
        eprintln!("batch {id} is not sealed yet: waiting until it is sealed and finished");
    }
    let result = loop {
        let chunk = args.timeout.unwrap_or(Duration::from_secs(3600));
        match backend.wait(&batch, target, chunk).await {
            Err(CoreError::Timeout { .. }) if args.timeout.is_none() => {}
            other => break other,
        }
    };
    match result {
        Ok(progress) => {
            let stages = progress
                .stages
                .iter()
                .filter(|s| args.stage.is_none_or(|max| s.stage <= max));
            let (dead, cancelled) = stages.fold((0, 0), |(d, c), s| (d + s.dead, c + s.cancelled));
            if args.json {
                let out = Outcome {
                    reached: true,
                    succeeded: dead + cancelled == 0,
                    progress: &progress,
                };
                outln!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                print_batch(&progress);
            }
            if dead + cancelled > 0 {
                eprintln!("{what} is finished, with {dead} dead and {cancelled} cancelled jobs");
                Ok(exit::FAILED)
            } else {
                if !args.json {
                    outln!("{what} is finished: every job succeeded");
                }
                Ok(exit::OK)
            }
        }
        Err(CoreError::Timeout { .. }) => {
            let now = backend.batch_progress(&batch).await?;
            if args.json {
                let out = Outcome {
                    reached: false,
                    succeeded: false,
                    progress: &now,
                };
                outln!("{}", serde_json::to_string_pretty(&out)?);
            }
            let (pending, running) = now
                .stages
                .iter()
                .filter(|s| args.stage.is_none_or(|max| s.stage <= max))
                .fold((0, 0), |(p, r), s| (p + s.pending, r + s.running));
            eprintln!(
                "relayq: timed out after {} waiting for {what} of queue {:?}: {pending} pending and {running} running jobs left{}",
                crate::words::duration(args.timeout.unwrap_or_default()),
                batch.queue,
                if target == WaitFor::Batch && !now.sealed {
                    "; the batch is not sealed"
                } else {
                    ""
                }
            );
            Ok(exit::TIMEOUT)
        }
        Err(e) => Err(e).context("waiting for the batch"),
    }
}

/// `--job`: waits for one job (SPEC D6); 0 when it succeeded, 1 when it ended dead or
/// cancelled, 124 on timeout. With `--json`, the job as `relayq job --json` prints it.
async fn one_job(backend: &dyn relayq_core::Backend, args: &WaitArgs) -> anyhow::Result<u8> {
    let id = relayq_core::JobId(args.job.unwrap_or_default());
    let queue = &args.queue.queue;
    let result = loop {
        let chunk = args.timeout.unwrap_or(Duration::from_secs(3600));
        match backend.wait_job(queue, id, chunk).await {
            Err(CoreError::Timeout { .. }) if args.timeout.is_none() => {}
            other => break other,
        }
    };
    match result {
        Ok(job) => {
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&job)?);
            }
            if job.state == relayq_core::JobState::Succeeded {
                if !args.json {
                    outln!("job {id} succeeded");
                }
                Ok(exit::OK)
            } else {
                let why = job.last_error.as_deref().and_then(|e| e.lines().next());
                let why = why.map_or_else(String::new, |e| format!(": {}", super::printable(e)));
                eprintln!("job {id} ended {}{why}", job.state);
                Ok(exit::FAILED)
            }
        }
        Err(CoreError::Timeout { .. }) => {
            let now = backend.job(queue, id).await?;
            eprintln!(
                "relayq: timed out after {} waiting for job {id} of queue {queue:?}: it is {}",
                crate::words::duration(args.timeout.unwrap_or_default()),
                now.state
            );
            Ok(exit::TIMEOUT)
        }
        Err(e) => Err(e).context("waiting for the job"),
    }
}
