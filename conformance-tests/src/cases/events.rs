//! SPEC W2, B5 — notifications, for backends with [`Capability::Notifications`]: what
//! lets an idle worker, or a `wait`, wake at once instead of at its next poll.
//!
//! [`Capability::Notifications`]: crate::Capability::Notifications

use std::time::Duration;

use anyhow::{Context, bail};
use relayq_core::{CompleteExt, EnqueueExt, EventKind, NewJob, OnFailure};
use tokio::{
    sync::broadcast::{Receiver, error::RecvError},
    time::{Instant, timeout},
};

use super::support::{PATIENCE, claim};
use crate::{Env, queue_name};

/// SPEC W2, B5: an enqueue on one handle, and then the last job of a batch finishing
/// there, each wake a subscriber on another handle with an event for that queue (what
/// an idle worker, and a `wait` on the batch, listen for).
pub async fn w2_enqueue_and_finish_wake_subscribers(env: &Env) -> anyhow::Result<()> {
    let listener = env.connect().await?;
    let mut rx = listener
        .subscribe()
        .context("the backend declares notifications, but `subscribe` returned None")?;
    let q = queue_name("w2");
    let batch = env.backend().open_batch(&q, OnFailure::Continue).await?;
    // A server's listener may still be starting (LISTEN, SUBSCRIBE): notifications are
    // hints, so enqueue again until one arrives rather than count on the first.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let job = NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, 100);
        env.backend().enqueue_one(job).await?;
        if woke(&mut rx, &q, EventKind::Ready, Duration::from_millis(250)).await? {
            break;
        }
        if Instant::now() >= deadline {
            bail!("no Ready event for {q} within {PATIENCE:?} of enqueues");
        }
    }
    env.backend().seal(&batch).await?;
    for job in claim(env.backend(), &q, 1000).await? {
        env.backend().complete(&job.lease).await?;
    }
    if !woke(&mut rx, &q, EventKind::Finished, PATIENCE).await? {
        bail!("no Finished event for {q} within {PATIENCE:?} of its batch finishing");
    }
    Ok(())
}

/// Whether an event of `kind` for `queue` (or a resync) arrives within `within`.
async fn woke(
    rx: &mut Receiver<relayq_core::Event>,
    queue: &str,
    kind: EventKind,
    within: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, rx.recv()).await {
            Err(_) => return Ok(false),
            Ok(Ok(ev)) if ev.concerns(queue, kind) => return Ok(true),
            Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
            Ok(Err(RecvError::Closed)) => bail!("the event channel closed"),
        }
    }
}
