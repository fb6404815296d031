//! The automatic prefetch: how far ahead of its free slots a worker claims when no
//! fixed [`prefetch`](super::WorkerBuilder::prefetch) is set.
//!
//! A worker that claims only for free slots spends a claim round trip per handful of
//! short jobs, and each claim statement pays a fixed cost on the server. When that
//! cost grows (dead rows behind the claim index while vacuum is held back took it from
//! 0.1 ms to 14 ms per claim) a worker of 16 slots with 1 ms jobs fell from 2,000 to
//! 470 jobs/s and never caught up, while the same worker with a fixed prefetch of 256
//! kept up. The target here follows the worker's own pace: enough jobs for four claim
//! round trips at the rate slots take jobs, so each claim brings a few round trips'
//! worth and claims stay few while they are slow. A worker of long jobs starts a few
//! jobs a second, its target rounds to 0, and it claims only for free slots: a long
//! job's lease is never parked in the buffer.
//!
//! And at least what the slots take in [`FLOOR`]: a claim pays a fixed cost on the
//! server and in the worker whatever it brings, and where both share a few cores that
//! cost is taken from the jobs. Four round trips of a fast claim are a few jobs, so a
//! worker of short jobs went back to the server every few jobs, where peers that fetch
//! a hundred at a time drained faster. A worker of long jobs still rounds to 0 (with
//! 16 slots, jobs longer than 0.4 s).
//!
//! Nor more than the slots take in half the buffer's hold (one heartbeat interval):
//! a job held longer goes back unrun. Without that bound slow claims fed themselves:
//! on SQLite, four worker processes of 16 slots (lease 3 s, so a 1 s hold) waited on
//! the write lock, the longer round trips raised the target past what the slots could
//! start within the hold, and the released jobs' writes made the claims slower still:
//! 317,429 attempts logged for 115,729 commands run in the torture's 100,000-job run.

use std::time::Duration;

use tokio::time::Instant;

/// The most the automatic target asks for ahead of the free slots.
pub(super) const AUTO_MAX: u32 = 256;
/// Round trips' worth of jobs the buffer aims to hold.
const ROUND_TRIPS: f64 = 4.0;
/// The slots' work the buffer holds at least, in seconds.
const FLOOR: f64 = 0.025;
/// The shortest window the start rate is measured over. Long enough that slots filling
/// at once after a quiet spell (jobs of one length, started together) are not taken
/// for the rate they take jobs at: measured over a few milliseconds, 64 slots of 2 s
/// jobs looked like thousands of starts a second and held tens of jobs ahead.
const WINDOW: Duration = Duration::from_millis(50);
/// Weight of the newest measurement in the moving averages.
const NEWEST: f64 = 0.3;

/// Moving averages of the rate jobs start at and of the claim round trip.
pub(super) struct Pace {
    /// Jobs started per second.
    rate: f64,
    /// Seconds per claim.
    round_trip: f64,
    started: u32,
    since: Instant,
    /// How long a buffered job may wait for a slot.
    hold: Duration,
}

impl Pace {
    pub(super) fn new(now: Instant, hold: Duration) -> Self {
        Self {
            rate: 0.0,
            round_trip: 0.0,
            started: 0,
            since: now,
            hold,
        }
    }

    /// A job moved into a slot.
    pub(super) fn started(&mut self) {
        self.started = self.started.saturating_add(1);
    }

    /// A claim came back after `took`.
    pub(super) fn claimed(&mut self, took: Duration, now: Instant) {
        self.round_trip = mix(self.round_trip, took.as_secs_f64());
        let window = now.duration_since(self.since);
        if window >= WINDOW {
            self.rate = mix(self.rate, f64::from(self.started) / window.as_secs_f64());
            self.started = 0;
            self.since = now;
        }
    }

    /// Jobs to hold ahead of the free slots, 0..=[`AUTO_MAX`].
    pub(super) fn target(&self) -> u32 {
        let ahead = (ROUND_TRIPS * self.round_trip).max(FLOOR);
        let within_hold = self.hold.as_secs_f64() / 2.0;
        let jobs = (self.rate * ahead.min(within_hold)).floor();
        if jobs >= f64::from(AUTO_MAX) {
            AUTO_MAX
        } else if jobs >= 1.0 {
            // In range: checked above.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let jobs = jobs as u32;
            jobs
        } else {
            0
        }
    }
}

fn mix(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        old * (1.0 - NEWEST) + new * NEWEST
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs 40 claims of `took` each, one every `every`, with `per_claim` jobs
    /// starting between them.
    fn paced(per_claim: u32, took: Duration, every: Duration) -> Pace {
        paced_holding(per_claim, took, every, Duration::from_secs(10))
    }

    fn paced_holding(per_claim: u32, took: Duration, every: Duration, hold: Duration) -> Pace {
        let mut now = Instant::now();
        let mut pace = Pace::new(now, hold);
        for _ in 0..40 {
            for _ in 0..per_claim {
                pace.started();
            }
            now += every;
            pace.claimed(took, now);
        }
        pace
    }

    #[test]
    fn short_jobs_behind_slow_claims_are_claimed_ahead() {
        // 28 jobs per 14 ms claim: 2,000 jobs/s.
        let ms14 = Duration::from_millis(14);
        let pace = paced(28, ms14, ms14);
        assert!(
            (100..=AUTO_MAX).contains(&pace.target()),
            "target {}",
            pace.target()
        );
    }

    #[test]
    fn the_target_is_capped() {
        let ms50 = Duration::from_millis(50);
        let pace = paced(1_000, ms50, ms50);
        assert_eq!(pace.target(), AUTO_MAX);
    }

    #[test]
    fn long_jobs_are_claimed_only_for_free_slots() {
        // 16 slots of 10 s jobs start 1.6 jobs a second; claims take 1 ms.
        let pace = paced(1, Duration::from_millis(1), Duration::from_millis(625));
        assert_eq!(pace.target(), 0);
    }

    #[test]
    fn a_worker_that_has_started_nothing_claims_nothing_ahead() {
        assert_eq!(
            Pace::new(Instant::now(), Duration::from_secs(1)).target(),
            0
        );
    }

    #[test]
    fn fast_claims_still_bring_the_slots_work_of_the_floor() {
        // SPEC W1: one slot starting 10,000 jobs/s, claims of 0.3 ms: four round trips
        // would be 12 jobs; the floor (25 ms of the slots' work) asks for 250.
        let pace = paced(30, Duration::from_micros(300), Duration::from_millis(3));
        assert_eq!(pace.target(), 250);
    }

    #[test]
    fn slots_that_fill_at_once_are_not_taken_for_a_fast_rate() {
        // SPEC W1 (0 for long jobs): 64 slots of 2 s jobs that end together: every 2 s
        // one claim after the quiet spell, then 64 starts within 13 ms, a claim
        // returning every 0.2 ms.
        let mut now = Instant::now();
        let mut pace = Pace::new(now, Duration::from_secs(10));
        for _ in 0..10 {
            now += Duration::from_secs(2);
            pace.claimed(Duration::from_millis(1), now);
            for _ in 0..64 {
                pace.started();
                now += Duration::from_micros(200);
                pace.claimed(Duration::from_micros(200), now);
            }
        }
        assert_eq!(pace.target(), 0);
    }

    #[test]
    fn no_more_is_claimed_ahead_than_the_slots_take_in_half_the_hold() {
        // 40 jobs per 400 ms claim: 100 jobs/s. Four round trips would be 160 jobs,
        // which the slots start in 1.6 s; a 1 s hold would send 60 of them back.
        let ms400 = Duration::from_millis(400);
        let pace = paced_holding(40, ms400, ms400, Duration::from_secs(1));
        assert_eq!(pace.target(), 50);
        // With a hold of 10 s (a 30 s lease), four round trips' worth.
        assert_eq!(paced(40, ms400, ms400).target(), 160);
    }
}
