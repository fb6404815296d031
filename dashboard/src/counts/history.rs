//! What the charts draw: a queue's counts sampled as this dashboard counts it, one
//! sample per [`EVERY`] at most, for the last [`KEPT`]. The backends keep no history
//! of their own that is cheap to read (counting finished jobs per minute would read
//! every one of them), so the charts cover the time this dashboard has been running:
//! the sampler counts every queue in use every [`EVERY`], whether a page polls it or
//! not, and a queue whose count is slow as often as the counts' rules allow.

use std::collections::VecDeque;

use chrono::{DateTime, TimeDelta, Utc};
use relayq_core::{JobState, QueueStats};
use serde::Serialize;

/// The least time between two samples.
pub(crate) const EVERY: TimeDelta = TimeDelta::seconds(5);
/// The least time between two kept samples: a little under [`EVERY`], so that the
/// sampler's count that came a moment early (its last one took longer) is kept, not
/// dropped for a 10 s gap.
const MIN_GAP: TimeDelta = TimeDelta::seconds(4);
/// How far back the samples go.
pub(crate) const KEPT: TimeDelta = TimeDelta::hours(1);

/// One sample of a queue's counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Sample {
    pub(crate) at: DateTime<Utc>,
    pub(crate) succeeded: u64,
    pub(crate) dead: u64,
    pub(crate) ready: u64,
    pub(crate) running: u64,
    /// How long the longest-waiting claimable job had waited, in seconds.
    pub(crate) oldest_ready_seconds: Option<f64>,
}

/// A queue's samples, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Keeps the count taken at `at` unless the last sample is under [`MIN_GAP`] old;
    /// drops samples older than [`KEPT`].
    pub(crate) fn record(&mut self, at: DateTime<Utc>, stats: &QueueStats) {
        if self.samples.back().is_some_and(|s| at - s.at < MIN_GAP) {
            return;
        }
        while self.samples.front().is_some_and(|s| at - s.at > KEPT) {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at,
            succeeded: stats.count(JobState::Succeeded),
            dead: stats.count(JobState::Dead),
            ready: stats.count(JobState::Ready) + stats.count(JobState::Retrying),
            running: stats.count(JobState::Running),
            oldest_ready_seconds: stats.oldest_ready_age(at).map(|d| d.as_secs_f64()),
        });
    }

    /// The samples of the last [`KEPT`] before `now`, oldest first.
    pub(crate) fn samples(&self, now: DateTime<Utc>) -> Vec<Sample> {
        self.samples
            .iter()
            .filter(|s| now - s.at <= KEPT)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(succeeded: u64) -> QueueStats {
        let mut s = QueueStats::default();
        s.counts.insert(JobState::Succeeded, succeeded);
        s
    }

    #[test]
    fn one_sample_per_interval_for_the_last_hour() {
        let t0 = Utc::now();
        let mut h = History::default();
        h.record(t0, &stats(1));
        h.record(t0 + TimeDelta::seconds(1), &stats(2));
        assert_eq!(
            h.samples(t0).len(),
            1,
            "a second count within 4 s is not kept"
        );
        h.record(t0 + EVERY, &stats(3));
        assert_eq!(
            h.samples(t0 + EVERY)
                .iter()
                .map(|s| s.succeeded)
                .collect::<Vec<_>>(),
            [1, 3]
        );
        h.record(t0 + KEPT + EVERY + TimeDelta::seconds(1), &stats(9));
        let later = t0 + KEPT + EVERY + TimeDelta::seconds(1);
        let kept: Vec<u64> = h.samples(later).iter().map(|s| s.succeeded).collect();
        assert_eq!(kept, [9], "samples over an hour old go");
        assert!(
            h.samples(later + KEPT + EVERY).is_empty(),
            "nor are old ones read"
        );
    }
}
