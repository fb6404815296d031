//! Writing handlers' progress (SPEC L7). A handler reports as often as it likes into its
//! job's [`Control`]; once a second the keeper takes every running job's latest report
//! and writes them together, in one [`report_progress`](crate::Complete::report_progress)
//! call per 1000 jobs, on a task of its own. So each job writes at most once a second,
//! a worker makes one call a second however many jobs report, and neither the claim
//! nor the settle path waits for it. A write still out when the next second comes
//! makes that second skip: reports are coalesced, never queued.

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use super::{control::Control, revoke};
use crate::{Backend, JobId, ProgressReport, Result};

/// How often the keeper writes progress.
pub(super) const EVERY: Duration = Duration::from_secs(1);

/// Takes the job's latest report not yet written, if any.
pub(super) fn take(control: &Control) -> Option<(u8, String)> {
    control
        .progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}

/// Writes `reports`; the jobs whose lease no longer holds.
pub(super) async fn write(
    backend: Arc<dyn Backend>,
    reports: Vec<ProgressReport>,
    within: Duration,
) -> Result<Vec<JobId>> {
    revoke::in_chunks(
        backend,
        reports,
        within,
        "report_progress",
        |b, chunk| async move { b.report_progress(&chunk).await },
    )
    .await
}
