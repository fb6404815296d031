//! One warning per outage, not one per failed call.
//!
//! While its server is down a worker retries claims (with backoff up to `poll_max`),
//! heartbeats (every interval, for every running job) and settles. Logging each
//! failure would bury the one line an operator needs: the server went away, and when
//! it came back. So the first failure after a success logs a warning, later ones log
//! at debug, and the first success after a failure logs how long it lasted.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::Error;

/// The server's state as the worker's calls see it.
#[derive(Debug, Default)]
pub(super) struct Outage {
    /// The worker's name: the `worker` label of its error counts.
    worker: String,
    /// When the current outage began; `None` while calls succeed.
    since: Mutex<Option<(Instant, u64)>>,
}

impl Outage {
    /// No outage yet, for the worker named `worker`.
    pub(super) fn new(worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            ..Self::default()
        }
    }

    /// A call failed with a backend error: `op` is `claim`, `heartbeat` or `settle`,
    /// `what` says more. Counted in `relayq_worker_backend_errors_total{op,kind}`.
    pub(super) fn failed(&self, op: &'static str, what: &str, error: &Error) {
        metrics::counter!("relayq_worker_backend_errors_total", "op" => op, "kind" => error.kind().as_str(), "worker" => self.worker.clone())
            .increment(1);
        let mut since = self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &mut *since {
            None => {
                *since = Some((Instant::now(), 1));
                tracing::warn!(error = %error, "{what} failed: the server looks unreachable; retrying with backoff, and saying so again only once it answers");
            }
            Some((_, n)) => {
                *n += 1;
                tracing::debug!(error = %error, failures = *n, "{what} failed again");
            }
        }
    }

    /// A call succeeded: the end of an outage, if one was on.
    pub(super) fn succeeded(&self) {
        let mut since = self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, n)) = since.take() {
            let lasted =
                Duration::from_millis(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
            tracing::warn!(after = ?lasted, failures = n, "the server answers again; claims, heartbeats and settles resume");
        }
    }

    /// Whether an outage is on: the last call failed.
    #[cfg(test)]
    fn is_on(&self) -> bool {
        self.since.lock().is_ok_and(|s| s.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_starts_at_the_first_failure_and_ends_at_the_next_success() {
        let o = Outage::default();
        assert!(!o.is_on());
        o.succeeded();
        assert!(!o.is_on());
        o.failed("claim", "claim", &Error::transient("refused"));
        o.failed("heartbeat", "heartbeat", &Error::transient("refused"));
        assert!(o.is_on());
        assert_eq!(o.since.lock().unwrap().map(|(_, n)| n), Some(2));
        o.succeeded();
        assert!(!o.is_on());
    }
}
