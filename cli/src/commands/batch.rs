//! `relayq batch open|seal`: batches for jobs enqueued one by one.

use relayq_core::{Batch, BatchId, OnFailure};

use crate::{
    args::QueueArg,
    backend::{self, Use},
    exit,
};

/// `relayq batch ...`.
#[derive(Debug, clap::Subcommand)]
pub enum BatchCommand {
    /// Open a batch; prints its id. Add jobs with `relayq enqueue --batch ID --stage S`.
    Open {
        #[command(flatten)]
        queue: QueueArg,
        /// What a dead job does: `continue`, or `halt` (cancel the rest of the batch, running jobs included).
        #[arg(long, default_value = "continue", value_parser = on_failure)]
        on_failure: OnFailure,
        /// A name people read on `status`, `run` and the dashboard (1 to 255 bytes).
        #[arg(long)]
        name: Option<String>,
    },
    /// Seal a batch: no more jobs; it is finished when all its jobs are.
    Seal {
        /// The batch.
        id: i64,
        #[command(flatten)]
        queue: QueueArg,
    },
}

fn on_failure(text: &str) -> Result<OnFailure, String> {
    text.parse()
        .map_err(|_| format!("expected continue or halt, got {text:?}"))
}

/// Runs the batch subcommand; returns the exit code.
///
/// # Errors
/// Bad queue, unknown batch, a backend failure.
pub async fn run(db: &str, cmd: BatchCommand) -> anyhow::Result<u8> {
    match cmd {
        BatchCommand::Open {
            queue,
            on_failure,
            name,
        } => {
            if let Some(name) = &name {
                relayq_core::validate::label("name", name)?;
            }
            let backend = backend::open(db, Use::Create).await?;
            let batch = match &name {
                Some(name) => {
                    backend
                        .open_named_batch(&queue.queue, on_failure, name)
                        .await?
                }
                None => backend.open_batch(&queue.queue, on_failure).await?,
            };
            outln!("{}", batch.id);
        }
        BatchCommand::Seal { id, queue } => {
            let backend = backend::open(db, Use::Existing).await?;
            backend
                .seal(&Batch {
                    queue: queue.queue.clone(),
                    id: BatchId(id),
                })
                .await?;
            outln!("batch {id} of queue {:?} is sealed", queue.queue);
        }
    }
    Ok(exit::OK)
}
