//! `relayq wait BATCH_ID`: wait for a stage or a whole batch.

use std::time::Duration;

use anyhow::Context;
use relayq_core::{Batch, BatchId, BatchProgress, Error as CoreError, OrderBarrierExt, WaitFor};
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
    pub batch: i64,
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
    let batch = Batch {
        queue: args.queue.queue.clone(),
        id: BatchId(args.batch),
    };
    let target = args.stage.map_or(WaitFor::Batch, WaitFor::Stage);
    let what = match args.stage {
        Some(s) => format!("stage {s} of batch {}", args.batch),
        None => format!("batch {}", args.batch),
    };
    let before = backend.batch_progress(&batch).await?;
    if target == WaitFor::Batch && !before.sealed {
        eprintln!(
            "batch {} is not sealed yet: waiting until it is sealed and finished",
            args.batch
        );
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
