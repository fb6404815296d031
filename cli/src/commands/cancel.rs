//! `relayq cancel (--job ID | --batch ID | --all -q QUEUE)`.

use relayq_core::{Batch, BatchId, JobId};

use crate::{
    backend::{self, Use},
    exit,
};

/// The queue of `relayq cancel`: optional, as `relayq job`'s.
#[derive(Debug, clap::Args)]
pub struct CancelQueue {
    /// The queue. Without it, a job is looked for in every queue in use (as `relayq
    /// job` does), and a batch in queue `default`.
    #[arg(long, short = 'q', env = "RELAYQ_QUEUE")]
    pub queue: Option<String>,
}

/// Arguments of `relayq cancel`.
#[derive(Debug, clap::Args)]
#[group(id = "target", required = true, multiple = false)]
pub struct CancelArgs {
    #[command(flatten)]
    pub queue: CancelQueue,
    /// Cancel this job: not started, it never runs; running, its lease is revoked and
    /// its worker stops it at once (a command's whole process group is killed).
    #[arg(long, group = "target")]
    pub job: Option<i64>,
    /// Cancel every unfinished job of this batch, and seal it.
    #[arg(long, group = "target")]
    pub batch: Option<i64>,
    /// Purge the queue named by -q (or RELAYQ_QUEUE): cancel every unfinished job of it,
    /// running ones at once, and seal their batches. Finished jobs, settings and
    /// schedules stay.
    #[arg(long, group = "target", requires = "queue")]
    pub all: bool,
}

/// Cancels; returns the exit code.
///
/// # Errors
/// No database, an unknown job or batch, a job found in two queues, a backend failure.
pub async fn run(db: &str, args: CancelArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    let queue = args.queue.queue;
    if let Some(id) = args.job {
        let job = super::job::find(&*backend, queue.as_deref(), JobId(id)).await?;
        let queue = job.queue;
        if backend.cancel_job(&queue, JobId(id)).await? {
            outln!("job {id} of queue {queue:?} is cancelled");
        } else {
            outln!("job {id} of queue {queue:?} had already finished; nothing to cancel");
        }
    } else if let Some(id) = args.batch {
        let queue = queue.unwrap_or_else(|| "default".to_owned());
        let n = backend
            .cancel_batch(&Batch {
                queue: queue.clone(),
                id: BatchId(id),
            })
            .await?;
        outln!("batch {id} of queue {queue:?}: {n} job(s) cancelled; the batch is sealed");
    } else if let Some(queue) = queue.filter(|_| args.all) {
        let n = backend.purge(&queue).await?;
        outln!("queue {queue:?}: {n} unfinished job(s) cancelled, running ones stopped");
    }
    Ok(exit::OK)
}
