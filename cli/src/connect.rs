//! Waiting for the database server: `relayq work` started before its server (or across
//! a restart) waits for it instead of exiting, and `relayq enqueue` retries what is
//! safe to retry.

use std::{sync::Arc, time::Duration};

use relayq_core::{Backend, Error as CoreError, retry::Policy};

use crate::{
    backend::{self, Use},
    exit,
};

/// Longest wait between two connection attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// Whether `e` is worth retrying: a backend error its backend calls transient (the
/// server refused or lost the connection, was busy or starting), as opposed to bad
/// input (a bad URL, an unknown scheme, a missing SQLite file) or a failure that would
/// come back (a wrong password, a missing permission).
pub fn transient(e: &anyhow::Error) -> bool {
    exit::code_for(e) == exit::FAILED
        && e.chain().any(|c| {
            c.downcast_ref::<CoreError>()
                .is_some_and(CoreError::is_transient)
        })
}

/// The backoff between attempts: from 100 ms, doubling, at most [`MAX_DELAY`], with
/// jitter so that a fleet of workers does not reconnect in step.
pub fn backoff(max_times: Option<usize>) -> impl Iterator<Item = Duration> {
    Policy {
        min_delay: Duration::from_millis(100),
        max_delay: MAX_DELAY,
        max_retries: max_times,
        jitter: true,
    }
    .backoff()
}

/// Opens the backend at `url`, waiting for its server as long as it takes: one line on
/// stderr when the first attempt fails, one when it answers. Bad input fails at once.
///
/// # Errors
/// A non-transient error of [`backend::open`].
pub async fn open_waiting(url: &str, need: Use) -> anyhow::Result<Arc<dyn Backend>> {
    let mut delays = backoff(None);
    let mut failures = 0u64;
    loop {
        match backend::open(url, need).await {
            Ok(b) => {
                if failures > 0 {
                    eprintln!(
                        "relayq: the database answers after {failures} failed attempts; starting"
                    );
                }
                return Ok(b);
            }
            Err(e) if transient(&e) => {
                if failures == 0 {
                    eprintln!(
                        "relayq: {}; waiting for the server (retrying every {} at most; Ctrl-C stops)",
                        crate::exit::describe(&e),
                        crate::words::duration(MAX_DELAY)
                    );
                }
                failures += 1;
                tokio::time::sleep(delays.next().unwrap_or(MAX_DELAY)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_backend_failures_are_retried() {
        let down = anyhow::Error::new(CoreError::transient("connection refused")).context("x");
        assert!(transient(&down));
        let denied = anyhow::Error::new(CoreError::backend("password authentication failed"));
        assert!(!transient(&denied.context("x")));
        assert!(!transient(&exit::usage("--db: bad")));
        assert!(!transient(
            &anyhow::Error::new(CoreError::invalid("url", "bad")).context("x")
        ));
        assert!(!transient(&anyhow::anyhow!("disk on fire")));
    }

    #[test]
    fn the_backoff_is_capped() {
        let delays: Vec<_> = backoff(Some(20)).collect();
        assert_eq!(delays.len(), 20);
        // Jitter adds up to the delay again.
        assert!(delays.iter().all(|d| *d <= MAX_DELAY * 2), "{delays:?}");
        assert!(delays[0] < Duration::from_secs(1));
    }
}
