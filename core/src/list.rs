//! Finding jobs: a queue's jobs by filter, newest first, page by page (SPEC M7).

use serde::{Deserialize, Serialize};

use crate::{BatchId, Error, JobId, JobState, Result, validate};

/// The most jobs one [`list_jobs`](crate::Inspect::list_jobs) call looks at. A filter
/// that matches few jobs then costs a bounded scan per call, never a scan of the whole
/// queue: the call returns what it found with a cursor to go on from.
pub const LIST_SCAN: u32 = 10_000;

/// The longest [`JobFilter::text`], in bytes.
pub const MAX_FILTER_TEXT: usize = 255;

/// Which jobs a listing returns: those matching every field that is set (SPEC M7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Jobs in this state, as [`JobInfo::state`](crate::JobInfo::state) reports it.
    pub state: Option<JobState>,
    /// Jobs of this batch.
    pub batch: Option<BatchId>,
    /// Jobs of this stage (of any batch, unless `batch` is set too).
    pub stage: Option<i32>,
    /// Jobs of this group.
    pub group: Option<String>,
    /// Jobs whose payload or last error contains this text, byte for byte (case
    /// matters): a command's name or words of its error.
    pub text: Option<String>,
}

impl JobFilter {
    /// Every job.
    #[must_use]
    pub fn all() -> Self {
        Self::default()
    }

    /// Only jobs in `state`.
    #[must_use]
    pub fn state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only jobs of `batch`.
    #[must_use]
    pub fn batch(mut self, batch: BatchId) -> Self {
        self.batch = Some(batch);
        self
    }

    /// Only jobs of `stage`.
    #[must_use]
    pub fn stage(mut self, stage: i32) -> Self {
        self.stage = Some(stage);
        self
    }

    /// Only jobs of `group`.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Only jobs whose payload or last error contains `text`.
    #[must_use]
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// Checks the fields a backend stores or searches: `group` as a label, `text` 1 to
    /// [`MAX_FILTER_TEXT`] bytes without NUL.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `group` or `text`.
    pub fn validate(&self) -> Result<()> {
        if let Some(group) = &self.group {
            validate::label("group", group)?;
        }
        if let Some(text) = &self.text {
            if text.is_empty() || text.len() > MAX_FILTER_TEXT {
                return Err(Error::invalid(
                    "text",
                    format!("must be 1 to {MAX_FILTER_TEXT} bytes, got {}", text.len()),
                ));
            }
            if text.contains('\0') {
                return Err(Error::invalid("text", "must not contain NUL"));
            }
        }
        Ok(())
    }

    /// Whether a job with these fields matches: the rule every backend's query
    /// follows, and the memory backend's own test.
    #[must_use]
    pub fn matches(&self, job: &JobFields<'_>) -> bool {
        self.state.is_none_or(|s| s == job.state)
            && self.batch.is_none_or(|b| job.batch == Some(b))
            && self.stage.is_none_or(|s| job.stage == Some(s))
            && self.group.as_deref().is_none_or(|g| job.group == Some(g))
            && self.text.as_deref().is_none_or(|t| {
                contains(job.payload, t.as_bytes())
                    || job
                        .last_error
                        .is_some_and(|e| contains(e.as_bytes(), t.as_bytes()))
            })
    }
}

/// What [`JobFilter::matches`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct JobFields<'a> {
    /// The state as reported.
    pub state: JobState,
    /// Its batch.
    pub batch: Option<BatchId>,
    /// Its stage.
    pub stage: Option<i32>,
    /// Its group.
    pub group: Option<&'a str>,
    /// Its payload.
    pub payload: &'a [u8],
    /// Its last error.
    pub last_error: Option<&'a str>,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// One page of a listing (SPEC M7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPage {
    /// The matching jobs found, newest (highest id) first.
    pub jobs: Vec<JobId>,
    /// Where the listing goes on: pass it as `before` to read the next page. `None`
    /// when no job below this page matches. A page may hold fewer jobs than asked
    /// for and still have a `next`: the call stopped after looking at
    /// [`LIST_SCAN`] jobs.
    pub next: Option<JobId>,
}

impl JobPage {
    /// The page from a scan newest first: each examined id with whether it matched
    /// and its place in the scan (1 for the first). Stops at `limit` matches or at
    /// place [`LIST_SCAN`]; a backend's query may leave out the ids that did not match,
    /// but for the one at that place. A scan that ends before either bound looked at
    /// every job below `before`, so the page has no `next`.
    pub fn from_scan(scan: impl IntoIterator<Item = (i64, bool, i64)>, limit: u32) -> Self {
        let mut page = Self::default();
        for (id, hit, place) in scan {
            if hit {
                page.jobs.push(JobId(id));
            }
            if page.jobs.len() >= limit as usize || place >= i64::from(LIST_SCAN) {
                page.next = Some(JobId(id));
                break;
            }
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(payload: &[u8]) -> JobFields<'_> {
        JobFields {
            state: JobState::Ready,
            batch: Some(BatchId(3)),
            stage: Some(10),
            group: Some("g"),
            payload,
            last_error: Some("disk full"),
        }
    }

    #[test]
    fn every_set_field_must_match() {
        let job = fields(b"{\"name\":\"load orders\"}");
        assert!(JobFilter::all().matches(&job));
        assert!(
            JobFilter::all()
                .state(JobState::Ready)
                .batch(BatchId(3))
                .matches(&job)
        );
        assert!(!JobFilter::all().state(JobState::Dead).matches(&job));
        assert!(!JobFilter::all().stage(11).matches(&job));
        assert!(!JobFilter::all().group("h").matches(&job));
        assert!(JobFilter::all().text("load orders").matches(&job));
        assert!(JobFilter::all().text("full").matches(&job));
        assert!(!JobFilter::all().text("Load").matches(&job));
    }

    #[test]
    fn bad_filters_name_their_field() {
        let long = "x".repeat(MAX_FILTER_TEXT + 1);
        for (filter, field) in [
            (JobFilter::all().text(""), "text"),
            (JobFilter::all().text(long), "text"),
            (JobFilter::all().text("a\0b"), "text"),
            (JobFilter::all().group(""), "group"),
        ] {
            match filter.validate() {
                Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{filter:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_scan_stops_at_the_limit_or_the_budget() {
        let full = JobPage::from_scan([(9, true, 1), (8, false, 2), (7, true, 3)], 2);
        assert_eq!(full.jobs, [JobId(9), JobId(7)]);
        assert_eq!(full.next, Some(JobId(7)));
        let end = JobPage::from_scan([(9, true, 1), (8, false, 2)], 2);
        assert_eq!((end.jobs.len(), end.next), (1, None));
        let misses = (0..i64::from(LIST_SCAN) + 5)
            .rev()
            .zip(1_i64..)
            .map(|(id, place)| (id, false, place));
        let spent = JobPage::from_scan(misses, 2);
        assert!(spent.jobs.is_empty());
        assert_eq!(spent.next, Some(JobId(5)));
    }
}
