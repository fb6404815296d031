//! [`QueueUpdate`]: the settings of a queue that one [`Admin::update_queue`] call
//! changes.
//!
//! [`Admin::update_queue`]: crate::Admin::update_queue

/// What an [`Admin::update_queue`](crate::Admin::update_queue) call changes: each
/// setting left `None` keeps its stored value.
///
/// ```
/// use relayq_core::QueueUpdate;
/// let update = QueueUpdate::default().paused(false).max_running(Some(4));
/// assert_eq!(update.max_running, Some(Some(4)));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueUpdate {
    /// `Some(Some(rate))` limits the queue's starts to `rate` across all workers, from
    /// now on (SPEC K8); `Some(None)` lifts it.
    pub rate: Option<Option<crate::Rate>>,
    /// `Some(true)` pauses the queue's claims; `Some(false)` lets them go on.
    pub paused: Option<bool>,
    /// `Some(Some(n))` caps the queue's running jobs at `n` (from 1) across all workers;
    /// `Some(None)` lifts the cap.
    pub max_running: Option<Option<u32>>,
}

impl QueueUpdate {
    /// Pauses (`true`) or resumes (`false`) the queue.
    #[must_use]
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = Some(paused);
        self
    }

    /// Sets (`Some`) or lifts (`None`) the cap on running jobs.
    #[must_use]
    pub fn max_running(mut self, max: Option<u32>) -> Self {
        self.max_running = Some(max);
        self
    }

    /// Sets (`Some`) or lifts (`None`) the queue's rate limit (SPEC K8).
    #[must_use]
    pub fn rate(mut self, rate: Option<crate::Rate>) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Whether this update can let more jobs be claimed: a resume, or a cap raised or
    /// lifted. Backends wake the queue's workers then.
    #[must_use]
    pub fn may_free_claims(&self) -> bool {
        self.paused == Some(false) || self.max_running.is_some() || self.rate.is_some()
    }
}
