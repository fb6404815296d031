//! Running a transaction again after the server aborted it to resolve a race (a
//! deadlock victim, a serialization failure). Shared by the SQL backends, and there
//! for adapters written against this crate.

use std::{future::Future, time::Duration};

use backon::{ExponentialBuilder, Retryable};

use crate::{Error, Result};

/// How many times an aborted transaction is run again before its error is returned.
pub const TRANSIENT_RETRIES: usize = 5;

/// Runs `op`, and runs it again while it fails with an error that `transient` accepts,
/// at most [`TRANSIENT_RETRIES`] more times. The pauses between tries grow from 5 ms
/// and are jittered, so transactions that collided do not collide again in step.
///
/// # Behavior
/// - Success, or an error `transient` rejects, is returned at once, without another
///   try.
/// - After [`TRANSIENT_RETRIES`] failed retries the last error is returned as
///   [`ErrorKind::Persistent`](crate::ErrorKind::Persistent): callers do not retry it
///   again.
///
/// # Errors
/// The error of the last try.
pub async fn retry_transient<T, F, Fut>(op: F, transient: fn(&Error) -> bool) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    op.retry(
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(5))
            .with_max_delay(Duration::from_millis(100))
            .with_max_times(TRANSIENT_RETRIES)
            .with_jitter(),
    )
    .when(transient)
    .notify(|e, pause| {
        tracing::debug!(?pause, error = %e, "transaction aborted by the server; running it again");
    })
    .await
    // Retried as often as the policy allows: say so, or the worker's own retries of a
    // transient error would run the whole series again for each of theirs.
    .map_err(|e| if transient(&e) { e.retries_spent() } else { e })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn deadlock(e: &Error) -> bool {
        matches!(e, Error::Backend { source, .. } if source.to_string() == "deadlock")
    }

    /// Runs `retry_transient` over an operation that fails `fails` times with `error`;
    /// returns the result and how many times the operation ran.
    async fn run(fails: usize, error: fn() -> Error) -> (Result<u32>, usize) {
        let calls = AtomicUsize::new(0);
        let result = retry_transient(
            || async {
                if calls.fetch_add(1, Ordering::SeqCst) < fails {
                    Err(error())
                } else {
                    Ok(7)
                }
            },
            deadlock,
        )
        .await;
        (result, calls.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_success() {
        let (result, calls) = run(3, || Error::backend("deadlock")).await;
        assert_eq!(result.ok(), Some(7));
        assert_eq!(calls, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_return_at_once() {
        let (result, calls) = run(3, || Error::backend("connection reset")).await;
        assert!(matches!(result, Err(Error::Backend { .. })));
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_after_the_limit() {
        let (result, calls) = run(usize::MAX, || Error::backend("deadlock")).await;
        assert!(matches!(result, Err(Error::Backend { .. })));
        assert_eq!(calls, 1 + TRANSIENT_RETRIES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_error_that_outlasts_the_retries_is_persistent() {
        let (result, calls) = run(usize::MAX, || Error::transient("deadlock")).await;
        assert_eq!(calls, 1 + TRANSIENT_RETRIES);
        let e = result.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Persistent);
        assert!(!e.is_transient(), "the worker would retry it again: {e}");
    }
}
