//! A claim's admission under a queue's rate (SPEC K8–K10): the generic cell rate
//! algorithm, which keeps one value per queue, the theoretical arrival time (`tat`) of
//! the next start, in microseconds on the server's clock.
//!
//! With emission interval `e` ([`Rate::emission_us`]) and burst `B`, `k` jobs may start
//! at `now` when `max(tat, now) + k·e − now ≤ B·e`; then `tat` becomes
//! `max(tat, now) + k·e`. So any window of `per` holds at most `count` starts, whatever
//! the order of the times claims are judged at, and under a backlog `count − B + 1`
//! (all `count` with a burst of 1), less the rounding of `e` up to whole microseconds:
//! none when `e` is a whole number of them, under 1 % when it is 100 µs or more, about
//! half at 1,000,000 a second.

use std::time::Duration;

use crate::Rate;

/// What a queue's rate lets one claim start.
#[derive(Debug, Clone, Copy)]
pub struct RateAdmission {
    /// How many jobs the claim may take now, at most what it asked for.
    pub allowed: u32,
    asked: u32,
    base: i64,
    e: i64,
    burst: i64,
    now: i64,
}

/// The admission of a claim asking for `asked` jobs at `now` (microseconds), given the
/// stored `tat` (`None` before the first start under this rate).
#[must_use]
pub fn admit(rate: &Rate, tat: Option<i64>, now: i64, asked: u32) -> RateAdmission {
    let e = rate.emission_us().max(1);
    let burst = i64::from(rate.burst);
    let base = tat.map_or(now, |t| t.max(now));
    let room = (now + burst * e - base).div_euclid(e).max(0);
    RateAdmission {
        allowed: u32::try_from(room).unwrap_or(u32::MAX).min(asked),
        asked,
        base,
        e,
        burst,
        now,
    }
}

impl RateAdmission {
    /// The `tat` to store after `taken` jobs started; `None` to leave it as it is.
    #[must_use]
    pub fn tat(&self, taken: u32) -> Option<i64> {
        (taken > 0).then(|| self.base + i64::from(taken) * self.e)
    }

    /// After `taken` jobs started: the wait until the rate allows the next start, when
    /// the rate is what held the claim back (SPEC K10). `None` when the claim got all
    /// it asked for, or fewer than the rate allowed (the queue had no more).
    #[must_use]
    pub fn next_in(&self, taken: u32) -> Option<Duration> {
        if self.allowed >= self.asked || taken < self.allowed {
            return None;
        }
        let tat = self.tat(taken).unwrap_or(self.base);
        let wait = (tat - (self.burst - 1) * self.e - self.now).max(0);
        Some(Duration::from_micros(wait.unsigned_abs()))
    }
}

/// The rate a backend stored as its count, interval in microseconds and burst (a
/// missing burst is 1), if it stored one.
#[must_use]
pub fn stored(count: Option<i64>, per_us: Option<i64>, burst: Option<i64>) -> Option<Rate> {
    let count = u32::try_from(count?).ok()?;
    let per = Duration::from_micros(u64::try_from(per_us?).ok()?);
    let burst = u32::try_from(burst.unwrap_or(1)).ok()?;
    Some(Rate::new(count, per).with_burst(burst))
}

/// When the rate lets the next job start, if later than `now` (SPEC K11).
#[must_use]
pub fn next_start(rate: &Rate, tat: Option<i64>, now: i64) -> Option<i64> {
    let e = rate.emission_us().max(1);
    let at = tat? - (i64::from(rate.burst) - 1) * e;
    (at > now).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every window of `per` holds at most `count` starts, under claims of any size at
    /// any times, and a backlog claimed eagerly gets `count − burst + 1` per window.
    #[test]
    fn no_window_holds_more_than_the_count() {
        for (count, per_ms, burst) in [(5, 1000, 1), (10, 1000, 4), (3, 7, 3), (100, 1000, 1)] {
            let rate = Rate::new(count, Duration::from_millis(per_ms)).with_burst(burst);
            let per = i64::try_from(per_ms).unwrap() * 1000;
            let (mut tat, mut starts) = (None, Vec::new());
            let mut now = 1_000_000_i64;
            let mut seed = 7_u64;
            while now < 1_000_000 + 20 * per {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let asked = u32::try_from(seed >> 60).unwrap() + 1;
                let a = admit(&rate, tat, now, asked);
                if let Some(t) = a.tat(a.allowed) {
                    tat = Some(t);
                }
                starts.extend(std::iter::repeat_n(now, a.allowed as usize));
                now += i64::try_from((seed >> 40) % 300).unwrap() + 1;
            }
            for (i, &t) in starts.iter().enumerate() {
                let within = starts[i..].iter().take_while(|&&s| s < t + per).count();
                assert!(
                    within <= count as usize,
                    "{rate}: {within} starts in a window"
                );
            }
            let settled = starts
                .iter()
                .filter(|&&s| s >= 1_000_000 + 10 * per)
                .count();
            let windows = 10 - 1;
            assert!(
                settled >= ((count - burst + 1) * windows) as usize,
                "{rate}: {settled} starts in the last {windows} windows"
            );
        }
    }

    /// The bound holds when claims judged later carry earlier times (a claim timed at
    /// its transaction's start that waited for the lock behind a later one): every
    /// start is counted at the time its claim was judged at.
    #[test]
    fn the_bound_holds_for_times_out_of_order() {
        let rate = Rate::new(8, Duration::from_millis(100)).with_burst(3);
        let per = 100_000_i64;
        let (mut tat, mut starts) = (None, Vec::new());
        let mut seed = 11_u64;
        let mut clock = 5_000_000_i64;
        for _ in 0..5_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            clock += i64::try_from((seed >> 50) % 2_000).unwrap();
            // Up to 30 ms earlier than the clock: a transaction begun before a wait.
            let t = clock - i64::try_from((seed >> 20) % 30_000).unwrap();
            let a = admit(&rate, tat, t, 4);
            if let Some(next) = a.tat(a.allowed) {
                tat = Some(next);
            }
            starts.extend(std::iter::repeat_n(t, a.allowed as usize));
        }
        starts.sort_unstable();
        for (i, &t) in starts.iter().enumerate() {
            let within = starts[i..].iter().take_while(|&&s| s < t + per).count();
            assert!(within <= 8, "{within} starts within 100 ms of {t}");
        }
    }

    /// A claim the rate cut short learns when the next start is allowed.
    #[test]
    fn a_cut_claim_learns_the_wait() {
        let rate = Rate::new(10, Duration::from_secs(1));
        let a = admit(&rate, None, 0, 5);
        assert_eq!(a.allowed, 1);
        assert_eq!(a.next_in(1), Some(Duration::from_millis(100)));
        assert_eq!(a.tat(1), Some(100_000));
        let b = admit(&rate, Some(100_000), 40_000, 5);
        assert_eq!(b.allowed, 0);
        assert_eq!(b.next_in(0), Some(Duration::from_millis(60)));
        assert_eq!(next_start(&rate, Some(100_000), 40_000), Some(100_000));
        let c = admit(&rate, Some(100_000), 100_000, 1);
        assert_eq!((c.allowed, c.next_in(1)), (1, None), "got all it asked for");
        let d = admit(&rate, None, 0, 5);
        assert_eq!(d.next_in(0), None, "the queue had nothing: not the rate");
    }
}
