//! What a worker runs for each job, and how a handler says it failed (SPEC W3).

use std::{fmt, future::Future, time::Duration};

use async_trait::async_trait;

use crate::{ClaimedJob, Retry};

/// Why a handler failed, and whether to retry.
///
/// Any `std::error::Error` converts into a retryable `JobError`, so handlers can use
/// `?`; [`JobError::permanent`] marks a failure that must not be retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// The error text kept in the execution log.
    pub message: String,
    /// When to retry (if attempts are left); [`Retry::Never`] makes the job dead now.
    pub retry: Retry,
}

impl JobError {
    /// A retryable failure with the default backoff.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            retry: Retry::Backoff,
        }
    }

    /// A permanent failure: the job becomes dead whatever attempts are left.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            retry: Retry::Never,
        }
    }

    /// Retries after `delay` instead of the default backoff.
    #[must_use]
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry = Retry::After(delay);
        self
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for JobError {
    fn from(e: E) -> Self {
        Self::retryable(e)
    }
}

/// What a successful handler leaves: nothing (`()`), or a result (`String`), kept with
/// the attempt in the execution log and read as [`JobInfo::result`](crate::JobInfo::result)
/// (SPEC L5, L8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Done {
    /// The result; over the worker's
    /// [`max_result`](super::WorkerBuilder::max_result) (default 64 KiB) it fails the
    /// job instead.
    pub output: Option<String>,
}

impl From<()> for Done {
    fn from((): ()) -> Self {
        Self::default()
    }
}

impl From<String> for Done {
    fn from(output: String) -> Self {
        Self {
            output: Some(output),
        }
    }
}

/// Runs one job. Implement it for a type, or pass an async closure
/// `|job: ClaimedJob| async move { ... Ok::<_, JobError>(()) }` (or `Ok(output)` with a
/// `String` to keep in the execution log).
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs `job`. `Ok` completes it; `Err` fails it (SPEC W3).
    async fn handle(&self, job: ClaimedJob) -> Result<Done, JobError>;
}

#[async_trait]
impl<F, Fut, T, E> Handler for F
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Into<Done> + 'static,
    E: Into<JobError> + 'static,
{
    async fn handle(&self, job: ClaimedJob) -> Result<Done, JobError> {
        self(job).await.map(Into::into).map_err(Into::into)
    }
}
