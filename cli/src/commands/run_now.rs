//! `relayq run-now --job ID [-q QUEUE]`: a job that waits only for its time (scheduled,
//! or a retry in its backoff) made due now (SPEC M10).

use relayq_core::JobId;

use super::cancel::CancelQueue;
use crate::{
    backend::{self, Use},
    exit,
};

/// Arguments of `relayq run-now`.
#[derive(Debug, clap::Args)]
pub struct RunNowArgs {
    #[command(flatten)]
    pub queue: CancelQueue,
    /// The job: scheduled for later, or a retry waiting out its backoff. A job that
    /// waits for anything else (its group, its stage) or is not waiting is left as it is.
    #[arg(long)]
    pub job: i64,
}

/// Makes the job due; returns the exit code.
///
/// # Errors
/// No database, an unknown job, a job found in two queues, a backend failure.
pub async fn run(db: &str, args: RunNowArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    let id = JobId(args.job);
    let job = super::job::find(&*backend, args.queue.queue.as_deref(), id).await?;
    let queue = job.queue;
    if backend.run_now(&queue, &[id]).await? > 0 {
        outln!("job {id} of queue {queue:?} is due now");
    } else {
        outln!(
            "job {id} of queue {queue:?} is {}: it does not wait for its time alone, so nothing changed (relayq job {id} --why says what holds it)",
            job.state
        );
    }
    Ok(exit::OK)
}
