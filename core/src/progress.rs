//! What a running job says about itself: its progress while it runs, and its result
//! when it succeeds (SPEC L7, L8).

use serde::{Deserialize, Serialize};

use crate::Lease;

/// Longest progress message, in bytes.
pub const MAX_PROGRESS_MESSAGE: usize = 255;

/// Largest result a job may leave on success, in bytes (SPEC L8). A worker may be set
/// to a lower bound ([`WorkerBuilder::max_result`](crate::worker::WorkerBuilder::max_result)).
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// A job's progress as its handler last reported it (SPEC L7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The attempt that reported it: a retried job keeps its last attempt's progress
    /// until the new attempt reports.
    pub attempt: u32,
    /// How far along, 0 to 100.
    pub percent: u8,
    /// What it is doing, at most [`MAX_PROGRESS_MESSAGE`] bytes.
    pub message: String,
}

impl Progress {
    /// The progress from the text a backend stored ([`ProgressReport::stored`]);
    /// `None` for text that is not one.
    #[must_use]
    pub fn from_stored(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// One report for [`Complete::report_progress`](crate::Complete::report_progress).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressReport {
    /// The lease it is reported under: stored only while that lease holds the job.
    pub lease: Lease,
    /// How far along, 0 to 100.
    pub percent: u8,
    /// What it is doing.
    pub message: String,
}

impl ProgressReport {
    /// The progress this report stores.
    #[must_use]
    pub fn progress(&self) -> Progress {
        Progress {
            attempt: self.lease.attempt,
            percent: self.percent,
            message: self.message.clone(),
        }
    }

    /// The text a backend stores for it, read back by [`Progress::from_stored`]: one
    /// opaque column or field per job, so a backend needs no schema for its parts.
    #[must_use]
    pub fn stored(&self) -> String {
        serde_json::to_string(&self.progress()).expect("a Progress always serializes")
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::{JobId, LeaseToken};

    #[test]
    fn stored_text_reads_back() {
        let report = ProgressReport {
            lease: Lease {
                queue: "q".into(),
                job: JobId(7),
                token: LeaseToken::random(),
                attempt: 3,
                expires_at: Utc::now(),
                worker: "w".into(),
            },
            percent: 40,
            message: "copying \"x\"\n".into(),
        };
        assert_eq!(
            Progress::from_stored(&report.stored()),
            Some(report.progress())
        );
        assert_eq!(Progress::from_stored("not json"), None);
    }
}
