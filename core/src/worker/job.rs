//! One job's life inside a worker: run the handler in its own task (so a panic is
//! caught and a timeout can abort it), heartbeat the lease meanwhile, and hand the
//! outcome to the settler (SPEC W1, W3, W4).

use std::{any::Any, sync::Arc, time::Duration};

use tokio::{
    sync::mpsc,
    time::{Instant, MissedTickBehavior, interval_at, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Handler;
use crate::{Backend, ClaimedJob, Error, Retry, Settle};

pub(super) struct JobRun {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) lease_length: Duration,
    pub(super) heartbeat_every: Duration,
    pub(super) timeout: Option<Duration>,
    /// Cancelled when the shutdown deadline passes: the job is released.
    pub(super) abort: CancellationToken,
    pub(super) settle: mpsc::Sender<Settle>,
}

impl JobRun {
    pub(super) async fn run(self, job: ClaimedJob) {
        let lease = job.lease.clone();
        let span = tracing::info_span!("relayq.job", queue = %lease.queue, id = %lease.job, attempt = lease.attempt);
        let handler = self.handler.clone();
        let mut task =
            tokio::spawn(async move { handler.handle(job).await }.instrument(span.clone()));
        let start = Instant::now();
        let mut beat = interval_at(start + self.heartbeat_every, self.heartbeat_every);
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let deadline = self.timeout.map(|t| start + t);

        let settle = loop {
            tokio::select! {
                res = &mut task => break match res {
                    Ok(Ok(())) => Settle::complete(lease),
                    Ok(Err(e)) => Settle::fail(lease, e.message, e.retry),
                    Err(e) if e.is_panic() => {
                        Settle::fail(lease, format!("handler panicked: {}", panic_text(&*e.into_panic())), Retry::Backoff)
                    }
                    Err(_) => Settle::release(lease),
                },
                _ = beat.tick() => match self.backend.heartbeat(&lease, self.lease_length).await {
                    Ok(_) => {}
                    Err(Error::StaleLease) => {
                        // Cancelled, or expired and taken over: someone else owns it now.
                        task.abort();
                        span.in_scope(|| tracing::warn!("lease lost while running; handler stopped"));
                        return;
                    }
                    Err(e) => span.in_scope(|| tracing::warn!(error = %e, "heartbeat failed; will retry")),
                },
                () = sleep_until(deadline.unwrap_or(start)), if deadline.is_some() => {
                    task.abort();
                    let after = self.timeout.unwrap_or_default();
                    break Settle::fail(lease, format!("handler timed out after {after:?}"), Retry::Backoff);
                }
                () = self.abort.cancelled() => {
                    task.abort();
                    break Settle::release(lease);
                }
            }
        };
        span.in_scope(|| tracing::debug!(outcome = ?settle.outcome, "job done"));
        // The settler outlives every job task, so this only fails if it panicked; the
        // lease then expires and the job runs again.
        let _ = self.settle.send(settle).await;
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
