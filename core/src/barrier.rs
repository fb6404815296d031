//! The generic `wait` on a batch: re-check on events, poll no faster than every 100 ms.

use std::time::Duration;

use tokio::{
    sync::broadcast::error::RecvError,
    time::{Instant, sleep_until},
};

use crate::{Batch, BatchProgress, Error, EventKind, OrderBarrier, Result, WaitFor};

/// Interval of the polling fallback (SPEC B5: no faster than every 100 ms).
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Least time between two checks triggered by events, so a busy queue does not turn
/// every completion into a progress query.
const EVENT_GAP: Duration = Duration::from_millis(10);

/// Waits for `target` by asking [`OrderBarrier::reached`] on each `Finished` event of
/// the batch's queue and every [`POLL_INTERVAL`] otherwise; returns the batch's
/// progress once it is reached.
///
/// # Errors
/// [`Error::Timeout`] when `timeout` passes first; errors of `reached` and
/// `batch_progress`.
pub async fn wait_polling<B: OrderBarrier + ?Sized>(
    backend: &B,
    batch: &Batch,
    target: WaitFor,
    timeout: Duration,
) -> Result<BatchProgress> {
    let deadline = Instant::now() + timeout;
    let mut events = backend.subscribe();
    loop {
        let checked = Instant::now();
        // The cheap check first; the counts once it says yes. A job added to a finished
        // stage in between (SPEC B3 allows it while no higher stage is released) makes
        // the counts disagree: then the wait goes on.
        if backend.reached(batch, target).await? {
            let progress = backend.batch_progress(batch).await?;
            if progress.reached(target) {
                return Ok(progress);
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("{batch}, {target:?}"),
            });
        }
        let tick = deadline.min(checked + POLL_INTERVAL);
        if let Some(rx) = events.as_mut() {
            let woke = loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Ok(ev) if ev.concerns(&batch.queue, EventKind::Finished) => break true,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break true,
                        Err(RecvError::Closed) => { events = None; break false; }
                    },
                    () = sleep_until(tick) => break false,
                }
            };
            if woke {
                sleep_until(deadline.min(checked + EVENT_GAP)).await;
            } else {
                sleep_until(tick).await;
            }
        } else {
            sleep_until(tick).await;
        }
    }
}
