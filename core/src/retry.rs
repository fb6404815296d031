//! The one retry policy type of relayq ([`Policy`]), its presets, and
//! [`retry_transient`]: running a transaction again after the server aborted it to
//! resolve a race (a deadlock victim, a serialization failure). Shared by the backends
//! and the worker, and there for adapters written against this crate.

use std::{future::Future, time::Duration};

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};

use crate::{Error, Result};

/// How many times an aborted transaction is run again before its error is returned.
pub const TRANSIENT_RETRIES: usize = 5;

/// How often, and after which pauses, a failed call is made again: pauses that start at
/// `min_delay` and double up to `max_delay`, jittered when `jitter` is set (so that
/// callers that failed together do not try again in step), at most `max_retries` more
/// tries (`None`: until it succeeds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The first pause.
    pub min_delay: Duration,
    /// The longest pause.
    pub max_delay: Duration,
    /// How many tries after the first, at most; `None` for no limit.
    pub max_retries: Option<usize>,
    /// Whether each pause is stretched by a random part of itself.
    pub jitter: bool,
}

impl Policy {
    /// A transaction the server aborted to resolve a race: 5 ms to 100 ms, jittered,
    /// [`TRANSIENT_RETRIES`] more tries.
    pub const TRANSACTION: Self = Self {
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(100),
        max_retries: Some(TRANSIENT_RETRIES),
        jitter: true,
    };

    /// A call that failed on a lost connection, which the client re-opens by itself:
    /// 10 ms to 100 ms, three more tries.
    pub const RECONNECT: Self = Self {
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
        max_retries: Some(3),
        jitter: true,
    };

    /// The pauses, one per retry.
    pub fn backoff(self) -> impl Iterator<Item = Duration> + Send + Sync + 'static {
        self.builder().build()
    }

    fn builder(self) -> ExponentialBuilder {
        let b = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay);
        let b = if self.jitter { b.with_jitter() } else { b };
        match self.max_retries {
            Some(n) => b.with_max_times(n),
            None => b.without_max_times(),
        }
    }

    /// Runs `op`, and runs it again, after this policy's pauses, while it fails with an
    /// error that `retry` accepts.
    ///
    /// # Behavior
    /// - Success, or an error `retry` rejects, is returned at once, without another
    ///   try.
    /// - Once the retries run out, the last error is returned.
    ///
    /// # Errors
    /// The error of the last try.
    pub async fn run<T, E, F, Fut>(self, op: F, retry: impl FnMut(&E) -> bool) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        op.retry(self.builder())
            .when(retry)
            .notify(|e: &E, pause| tracing::debug!(?pause, error = %e, "retrying"))
            .await
    }
}

/// Runs `op` under [`Policy::TRANSACTION`]: again while it fails with an error that
/// `transient` accepts, so transactions that collided do not collide again in step.
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
    Policy::TRANSACTION
        .run(op, transient)
        .await
        // Retried as often as the policy allows: say so, or the worker's own retries
        // of a transient error would run the whole series again for each of theirs.
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
