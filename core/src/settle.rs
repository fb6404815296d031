//! How a leased attempt ends: complete, fail (with retry policy) or release (SPEC L).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Lease;

/// Default base of the exponential retry backoff (SPEC L2).
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default cap of the exponential retry backoff (SPEC L2).
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// Longest error text kept per attempt; longer text is cut at a character boundary.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// How many outcomes a worker settles in one call unless its backend prefers another
/// number ([`Complete::preferred_settle_batch`](crate::Complete::preferred_settle_batch)).
pub const DEFAULT_SETTLE_BATCH: usize = 128;

/// When a failed job may run again (SPEC L2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retry {
    /// Exponential backoff with jitter: base 1 s, doubling per attempt, capped at 1 h.
    #[default]
    Backoff,
    /// After this long (server time).
    After(Duration),
    /// Not before this instant.
    At(DateTime<Utc>),
    /// Never: the failure is permanent and the job becomes `dead`.
    Never,
}

impl Retry {
    /// The delay before the next attempt after attempt `attempt` failed, or `None` when
    /// the failure is permanent. [`Retry::At`] resolves against the server's `now`.
    #[must_use]
    pub fn delay(self, attempt: u32, now: DateTime<Utc>) -> Option<Duration> {
        match self {
            Self::Backoff => Some(backoff(attempt, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP)),
            Self::After(d) => Some(d),
            Self::At(t) => Some((t - now).to_std().unwrap_or(Duration::ZERO)),
            Self::Never => None,
        }
    }
}

/// Exponential backoff with "equal jitter": half of `min(cap, base * 2^(attempt-1))`
/// fixed, the other half random, so retries of many jobs failing together spread out
/// while each still waits at least half the nominal delay.
#[must_use]
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(32);
    let nominal = base.saturating_mul(1u32 << exp.min(31)).min(cap);
    let half = nominal / 2;
    let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(fastrand::u64(0..=jitter_nanos))
}

/// The outcome a worker reports for one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job succeeded (SPEC L1).
    Complete,
    /// The attempt failed (SPEC L2).
    Fail {
        /// The error text, kept in the execution log.
        error: String,
        /// When to try again, if attempts are left.
        retry: Retry,
    },
    /// Give the job back without counting the attempt (SPEC L4).
    Release,
}

/// One lease and its outcome, for [`Complete::settle_many`](crate::Complete::settle_many).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settle {
    /// The lease being settled.
    pub lease: Lease,
    /// What happened.
    pub outcome: Outcome,
    /// Text kept with the attempt in the execution log, such as a command's output
    /// (SPEC L5): on success the job's result, at most 64 KiB or the call is refused
    /// (SPEC L8); on failure cut to 64 KiB.
    pub output: Option<String>,
    /// How long the job waited in the worker between its claim and its handler's
    /// start (a claim ahead of free slots keeps jobs in a buffer): the attempt's start
    /// in the log is its claim plus this, never after its end (SPEC L5). `None` logs
    /// the claim time; the worker sends `None` for waits under 10 ms.
    pub waited: Option<std::time::Duration>,
}

impl Settle {
    /// Completes `lease`.
    #[must_use]
    pub fn complete(lease: Lease) -> Self {
        Self {
            lease,
            outcome: Outcome::Complete,
            output: None,
            waited: None,
        }
    }

    /// Keeps `output` with the attempt in the execution log.
    #[must_use]
    pub fn with_output(mut self, output: Option<String>) -> Self {
        self.output = output;
        self
    }

    /// Says the handler started `waited` after the claim: the attempt's start is
    /// logged then (SPEC L5).
    #[must_use]
    pub fn with_waited(mut self, waited: std::time::Duration) -> Self {
        self.waited = Some(waited);
        self
    }

    /// [`waited`](Self::waited) in whole microseconds, 0 when `None`, as backends store it.
    #[must_use]
    pub fn waited_micros(&self) -> i64 {
        self.waited
            .map_or(0, |w| i64::try_from(w.as_micros()).unwrap_or(i64::MAX))
    }

    /// Fails `lease` with `error`, retrying per `retry`.
    pub fn fail(lease: Lease, error: impl Into<String>, retry: Retry) -> Self {
        Self {
            lease,
            outcome: Outcome::Fail {
                error: error.into(),
                retry,
            },
            output: None,
            waited: None,
        }
    }

    /// Releases `lease`.
    #[must_use]
    pub fn release(lease: Lease) -> Self {
        Self {
            lease,
            outcome: Outcome::Release,
            output: None,
            waited: None,
        }
    }
}

/// What a settled lease led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The job is `succeeded`.
    Completed,
    /// The job is `retrying` until this instant.
    Retrying {
        /// When it may run again (server time).
        at: DateTime<Utc>,
    },
    /// The job is `dead`.
    Dead,
    /// The job is back to `ready`.
    Released,
}

/// Makes handler error text safe to store everywhere: NUL (which PostgreSQL text
/// rejects) becomes U+FFFD and the text is cut to [`MAX_ERROR_BYTES`].
#[must_use]
pub fn clean_error_text(text: &str) -> String {
    let mut end = text.len().min(MAX_ERROR_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace('\0', "\u{FFFD}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_secs(1);
        let cap = Duration::from_secs(3600);
        for attempt in 1..=40 {
            let nominal = base.saturating_mul(1u32 << (attempt - 1).min(31)).min(cap);
            let d = backoff(attempt, base, cap);
            assert!(d >= nominal / 2 && d <= nominal, "attempt {attempt}: {d:?}");
        }
        assert!(backoff(40, base, cap) <= cap);
    }

    #[test]
    fn error_text_is_cleaned() {
        assert_eq!(clean_error_text("a\0b"), "a\u{FFFD}b");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = clean_error_text(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
