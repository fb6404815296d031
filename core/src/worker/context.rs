//! What a running handler can learn about its job's lease: a token that fires when the
//! worker stops the handler, and the deadline by which it must have stopped unless a
//! renewal gets through (SPEC W1).
//!
//! The handler's future is dropped at its next `.await` when the worker stops it; the
//! token is for what that drop cannot reach: a thread, a spawned task, a child process
//! the handler started. Whoever runs such work should stop it when the token fires, or
//! by the [`LeaseDeadline`] at the latest, so that it never runs beside the job's next
//! attempt. `relayq work` does exactly that for its shell commands, from a guard process
//! that outlives a killed or frozen worker.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

tokio::task_local! {
    static CURRENT: JobContext;
}

/// The lease of a running job as its worker reckons it, on the worker's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseDeadline {
    /// When the worker stops the handler unless a heartbeat renews the lease first: the
    /// lease's end less a safety margin (see [`WorkerBuilder::heartbeat`]).
    ///
    /// [`WorkerBuilder::heartbeat`]: super::WorkerBuilder::heartbeat
    pub stop_at: Instant,
    /// When the lease itself runs out, reckoned from when the claim or renewing beat
    /// was sent (so never later than the server's reckoning). Past it another worker
    /// may hold the job.
    pub lease_ends: Instant,
}

impl LeaseDeadline {
    /// The margin between [`stop_at`](Self::stop_at) and the lease's end.
    #[must_use]
    pub fn margin(&self) -> Duration {
        self.lease_ends.saturating_duration_since(self.stop_at)
    }
}

/// A handler's view of its job while it runs: see [`JobContext::current`].
#[derive(Debug, Clone)]
pub struct JobContext {
    stop: CancellationToken,
    deadline: watch::Receiver<Option<LeaseDeadline>>,
    progress: Arc<Mutex<Option<(u8, String)>>>,
}

impl JobContext {
    pub(super) fn new(
        stop: CancellationToken,
        deadline: watch::Receiver<Option<LeaseDeadline>>,
        progress: Arc<Mutex<Option<(u8, String)>>>,
    ) -> Self {
        Self {
            stop,
            deadline,
            progress,
        }
    }

    /// Reports how far along the job is: `percent` (0 to 100) and what it is doing
    /// (SPEC L7). Call it as often as you like: the worker writes the latest report of
    /// each job at most once a second, off the claim and settle paths, so reports in
    /// between replace one another and a job that ends within the second may write
    /// none.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error) on `percent` over 100 or on a `message`
    /// over [`MAX_PROGRESS_MESSAGE`](crate::progress::MAX_PROGRESS_MESSAGE) bytes;
    /// nothing is kept then.
    pub fn progress(&self, percent: u8, message: impl Into<String>) -> crate::Result<()> {
        let message = message.into();
        crate::validate::progress_fields(percent, &message)?;
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = Some((percent, message));
        Ok(())
    }

    /// The context of the job whose handler is running on this task; `None` outside a
    /// worker's handler (or on a task the handler spawned: clone it there).
    #[must_use]
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Fires when the worker stops this handler without waiting for it: the lease was
    /// lost (cancelled, or expired and taken over), the lease reached
    /// [`LeaseDeadline::stop_at`] with no renewal through, the handler's timeout
    /// passed, or the shutdown deadline did. The handler's future is dropped at the
    /// same moment; the token is for work the drop does not reach.
    #[must_use]
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// The lease's current deadline; `None` only before the worker's heartbeat keeper
    /// has taken the job, which happens before the handler starts.
    #[must_use]
    pub fn deadline(&self) -> Option<LeaseDeadline> {
        *self.deadline.borrow()
    }

    /// A receiver that sees every renewal of the deadline (each heartbeat that got
    /// through), for passing it on to work outside the handler's future.
    #[must_use]
    pub fn deadlines(&self) -> watch::Receiver<Option<LeaseDeadline>> {
        self.deadline.clone()
    }

    /// Runs `fut` with this context as [`current`](Self::current).
    pub(super) async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }
}
