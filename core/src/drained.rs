//! Waiting until a queue has drained, for jobs outside any batch (where
//! [`OrderBarrier::wait`](crate::OrderBarrier::wait) does not apply).

use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Inspect, JobState, POLL_INTERVAL, QueueStats, Result};

/// Waits until `queue` holds no unfinished job: none ready, blocked, running or
/// retrying, and, with `scheduled`, none waiting for its `run_at` either. Polls
/// [`Inspect::queue_stats`] every [`POLL_INTERVAL`]; returns the counts it ended on.
///
/// Jobs enqueued while it waits keep it waiting: it answers "empty now", not "the jobs
/// I knew of are done" (for that, put them in a batch and wait for the batch).
///
/// # Errors
/// [`Error::Timeout`] when `timeout` passes first; errors of `queue_stats`.
pub async fn wait_drained<B: Inspect + ?Sized>(
    backend: &B,
    queue: &str,
    scheduled: bool,
    timeout: Duration,
) -> Result<QueueStats> {
    let deadline = Instant::now() + timeout;
    loop {
        let stats = backend.queue_stats(queue).await?;
        let mut open = [
            JobState::Ready,
            JobState::Blocked,
            JobState::Running,
            JobState::Retrying,
        ]
        .iter()
        .map(|s| stats.count(*s))
        .sum::<u64>();
        if scheduled {
            open += stats.count(JobState::Scheduled);
        }
        if open == 0 {
            return Ok(stats);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("queue {queue:?} to drain ({open} jobs left)"),
            });
        }
        tokio::time::sleep_until(deadline.min(Instant::now() + POLL_INTERVAL)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Claim, ClaimRequest, CompleteExt, EnqueueExt, NewJob, memory::MemoryBackend};

    #[tokio::test(start_paused = true)]
    async fn a_queue_is_drained_once_its_last_job_finished() {
        let b = MemoryBackend::new();
        b.enqueue_one(NewJob::new("q", vec![])).await.unwrap();
        let err = wait_drained(&b, "q", true, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        let job = b
            .claim(ClaimRequest::new("q", "w", 1, Duration::from_secs(30)))
            .await
            .unwrap()
            .remove(0);
        b.complete(&job.lease).await.unwrap();
        let stats = wait_drained(&b, "q", true, Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(stats.count(JobState::Succeeded), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_jobs_count_only_when_asked() {
        let b = MemoryBackend::new();
        b.enqueue_one(NewJob::new("q", vec![]).delay(Duration::from_secs(3600)))
            .await
            .unwrap();
        assert!(wait_drained(&b, "q", false, Duration::ZERO).await.is_ok());
        assert!(wait_drained(&b, "q", true, Duration::ZERO).await.is_err());
    }
}
