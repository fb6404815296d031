//! `relayq prune [-q Q] [--older-than D]`: the maintenance pass, by hand (SPEC M3).

use std::time::Duration;

use serde::Serialize;

use crate::{
    args::{QueueArg, duration},
    backend::{self, Use},
    exit,
};

/// Arguments of `relayq prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub queue: QueueArg,
    /// Delete finished jobs (succeeded, dead, cancelled) that finished longer ago than
    /// this, with their attempt log. `0s` deletes every finished job.
    #[arg(long, default_value = "7d", value_parser = duration)]
    pub older_than: Duration,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Pruned<'a> {
    queue: &'a str,
    older_than_secs: u64,
    pruned: u64,
    requeued: u64,
    dead: u64,
}

/// Runs one maintenance pass; returns the exit code.
///
/// # Errors
/// No database, a backend failure.
pub async fn run(db: &str, args: PruneArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    let queue = args.queue.queue.as_str();
    let m = backend.maintain(queue, args.older_than).await?;
    if args.json {
        let out = Pruned {
            queue,
            older_than_secs: args.older_than.as_secs(),
            pruned: m.pruned,
            requeued: m.requeued,
            dead: m.dead,
        };
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "queue {queue:?}: deleted {} finished job(s) older than {}; {} expired lease(s) recovered, {} job(s) out of attempts now dead",
            m.pruned,
            crate::words::duration(args.older_than),
            m.requeued,
            m.dead
        );
    }
    Ok(exit::OK)
}
