//! The generic wait for one job to finish: re-check on events, poll no faster than
//! every 100 ms, as the batch's wait does.

use std::time::Duration;

use tokio::{
    sync::broadcast::error::RecvError,
    time::{Instant, sleep_until},
};

use crate::{Error, EventKind, Inspect, JobId, JobInfo, OrderBarrier, POLL_INTERVAL, Result};

/// Waits until job `id` of `queue` is finished, reading it on each `Finished` event of
/// its queue and every [`POLL_INTERVAL`] otherwise; returns it then.
///
/// # Errors
/// [`Error::Timeout`] when `timeout` passes first; [`Error::NotFound`] for an unknown
/// job; errors of `job`.
pub async fn wait_job_polling<B: Inspect + OrderBarrier + ?Sized>(
    backend: &B,
    queue: &str,
    id: JobId,
    timeout: Duration,
) -> Result<JobInfo> {
    let deadline = Instant::now() + timeout;
    let mut events = backend.subscribe();
    loop {
        let checked = Instant::now();
        let job = backend.job(queue, id).await?;
        if job.state.is_finished() {
            return Ok(job);
        }
        if checked >= deadline {
            return Err(Error::Timeout {
                what: format!("job {id} of queue {queue:?}"),
            });
        }
        let tick = deadline.min(checked + POLL_INTERVAL);
        let Some(rx) = events.as_mut() else {
            sleep_until(tick).await;
            continue;
        };
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) if ev.concerns(queue, EventKind::Finished) => break,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => { events = None; break; }
                },
                () = sleep_until(tick) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Claim, CompleteExt, Enqueue, InspectExt, JobState, NewJob, memory::MemoryBackend};

    /// It returns the job once a completion finishes it, and times out on one that
    /// never finishes.
    #[tokio::test]
    async fn waits_for_the_job_to_finish_or_times_out() {
        let b = std::sync::Arc::new(MemoryBackend::new());
        let ids = b
            .enqueue(vec![NewJob::new("q", vec![]), NewJob::new("q", vec![])])
            .await
            .unwrap();
        let waiter = {
            let b = b.clone();
            let id = ids[0].id;
            tokio::spawn(async move { b.wait_job("q", id, Duration::from_secs(10)).await })
        };
        let got = b
            .claim(crate::ClaimRequest::new(
                "q",
                "w",
                1,
                Duration::from_secs(30),
            ))
            .await
            .unwrap();
        b.complete(&got[0].lease).await.unwrap();
        let done = waiter.await.unwrap().unwrap();
        assert_eq!(done.state, JobState::Succeeded);
        let late = b.wait_job("q", ids[1].id, Duration::from_millis(50)).await;
        assert!(matches!(late, Err(Error::Timeout { .. })), "{late:?}");
    }
}
