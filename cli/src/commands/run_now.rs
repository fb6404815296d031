//! `relayq run-now --job ID [-q QUEUE]`: a job that waits only for its time (scheduled,
//! or a retry in its backoff) made due now (SPEC M10).

use relayq_core::{JobId, JobState};

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
        return Ok(exit::OK);
    }
    // Read again: what it is now, not before the call.
    let job = backend.job(&queue, id).await?;
    let why = match job.state {
        JobState::Blocked => format!(
            "waits for its group or its stage, not its time; `relayq job {id} -q {queue} --why` says which"
        ),
        JobState::Running => "is running".to_owned(),
        JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
            format!("has finished ({})", job.state)
        }
        // Ready, or retrying past its backoff: nothing holds it but a free worker.
        _ => format!("is already due ({})", job.state),
    };
    outln!("job {id} of queue {queue:?} {why}: nothing changed");
    Ok(exit::OK)
}
