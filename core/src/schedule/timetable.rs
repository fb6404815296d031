//! A schedule's slots: its cron expression read in its time zone (SPEC S1, S4).

use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use croner::{
    Cron,
    parser::{CronParser, Seconds},
};

use crate::{Error, Result};

/// The slots of one cron expression in one time zone, as UTC instants.
///
/// Daylight-saving changes follow croner's rules (SPEC S4): a local time that does not
/// exist (spring forward) runs once, at the first local time after the gap; a local
/// time that happens twice (fall back) runs once, at its first occurrence.
#[derive(Debug, Clone)]
pub struct Timetable {
    cron: Cron,
    tz: Tz,
}

impl Timetable {
    /// Reads `cron` (five fields, or six with seconds first, or seven with a year
    /// last) in the IANA time zone `tz`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `cron` for an expression that does not parse or never
    /// fires, on `time_zone` for a name the time-zone database does not know.
    pub fn new(cron: &str, tz: &str) -> Result<Self> {
        let tz = Tz::from_str(tz).map_err(|_| {
            Error::invalid(
                "time_zone",
                format!("{tz:?} is not an IANA time zone (e.g. UTC, Europe/Berlin)"),
            )
        })?;
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(cron)
            .map_err(|e| Error::invalid("cron", format!("{cron:?} does not parse: {e}")))?;
        Ok(Self { cron: parsed, tz })
    }

    /// The first slot strictly after `t`, or `None` when there is none (a year field
    /// in the past).
    #[must_use]
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.find(floor(t), false, Direction::Next)
    }

    /// The first slot at or after `t`.
    #[must_use]
    pub fn next_from(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let whole = floor(t);
        self.find(whole, whole == t, Direction::Next)
    }

    /// The last slot at or before `t`.
    ///
    /// Croner's backward search does not always agree with its forward one around a
    /// daylight-saving change: into a spring-forward gap it answers the last second
    /// before the gap, which is no slot, and in a repeated fall-back hour it may answer
    /// the first of several slots. Slots are what the forward search finds, so the
    /// backward answer is only a starting point: moved back until the forward search
    /// confirms a slot at or before it, then forward to the last slot up to `t`.
    #[must_use]
    pub fn last_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = floor(t);
        let mut p = self.find(t, true, Direction::Previous)?;
        let mut tries = 0;
        loop {
            match self.next_from(p) {
                Some(q) if q <= t => {
                    p = q;
                    break;
                }
                _ => {
                    tries += 1;
                    if tries > 8 {
                        return None;
                    }
                    p = self.find(p - TimeDelta::seconds(1), true, Direction::Previous)?;
                }
            }
        }
        // A bound, not an expected count: within one repeated hour slots are a few.
        for _ in 0..100_000 {
            match self.next_after(p) {
                Some(n) if n <= t => p = n,
                _ => break,
            }
        }
        Some(p)
    }

    /// Croner keeps the fraction of a second it is given in what it finds; slots are
    /// whole seconds, so it is given whole seconds only.
    fn find(&self, t: DateTime<Utc>, inclusive: bool, d: Direction) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        let found = match d {
            Direction::Next => self.cron.find_next_occurrence(&local, inclusive),
            Direction::Previous => self.cron.find_previous_occurrence(&local, inclusive),
        };
        found.ok().map(|s| s.with_timezone(&Utc))
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Next,
    Previous,
}

/// `t` without its fraction of a second.
fn floor(t: DateTime<Utc>) -> DateTime<Utc> {
    t.with_nanosecond(0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn slots(t: &Timetable, from: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = from;
        for _ in 0..n {
            at = t.next_after(at).unwrap();
            out.push(at);
        }
        out
    }

    #[test]
    fn a_local_time_skipped_by_spring_forward_runs_once_after_the_gap() {
        // Berlin: 2026-03-29 02:00 CET becomes 03:00 CEST; 02:30 does not exist.
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        let got = slots(&t, utc(2026, 3, 27, 12, 0), 3);
        assert_eq!(
            got,
            [
                utc(2026, 3, 28, 1, 30),
                utc(2026, 3, 29, 1, 0),
                utc(2026, 3, 30, 0, 30)
            ]
        );
    }

    #[test]
    fn a_local_time_repeated_by_fall_back_runs_once() {
        // Berlin: 2026-10-25 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        let got = slots(&t, utc(2026, 10, 23, 12, 0), 3);
        assert_eq!(
            got,
            [
                utc(2026, 10, 24, 0, 30),
                utc(2026, 10, 25, 0, 30),
                utc(2026, 10, 26, 1, 30)
            ]
        );
    }

    #[test]
    fn the_last_slot_is_a_slot_across_both_changes() {
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        // After the spring change: the shifted 03:00 CEST, not a second before the gap.
        assert_eq!(
            t.last_until(utc(2026, 3, 29, 1, 10)),
            Some(utc(2026, 3, 29, 1, 0))
        );
        // Inside the gap's hour, before the shifted slot: the day before's.
        assert_eq!(
            t.last_until(utc(2026, 3, 29, 0, 59)),
            Some(utc(2026, 3, 28, 1, 30))
        );
        let q = Timetable::new("*/15 * * * *", "Europe/Berlin").unwrap();
        // Each local time runs once: the repeated hour (02:xx CET) has no slot, so in it
        // the last slot is 02:45 CEST, not the first 02:xx that croner's backward search
        // answers.
        assert_eq!(
            q.last_until(utc(2026, 10, 25, 1, 20)),
            Some(utc(2026, 10, 25, 0, 45))
        );
        assert_eq!(
            q.last_until(utc(2026, 10, 25, 0, 50)),
            Some(utc(2026, 10, 25, 0, 45))
        );
    }

    #[test]
    fn utc_is_never_shifted() {
        let t = Timetable::new("30 2 * * *", "UTC").unwrap();
        let got = slots(&t, utc(2026, 3, 28, 12, 0), 2);
        assert_eq!(got, [utc(2026, 3, 29, 2, 30), utc(2026, 3, 30, 2, 30)]);
    }

    #[test]
    fn seconds_are_optional() {
        let t = Timetable::new("*/15 * * * * *", "UTC").unwrap();
        let from = utc(2026, 1, 1, 0, 0);
        assert_eq!(
            t.next_after(from),
            Some(from + chrono::TimeDelta::seconds(15))
        );
        assert_eq!(t.next_from(from), Some(from));
        let late = from + chrono::TimeDelta::milliseconds(1500);
        assert_eq!(t.last_until(late), Some(from), "whole seconds only");
        assert_eq!(
            t.next_from(late),
            Some(from + chrono::TimeDelta::seconds(15))
        );
        assert_eq!(
            t.last_until(from + chrono::TimeDelta::seconds(20)),
            Some(from + chrono::TimeDelta::seconds(15))
        );
    }

    #[test]
    fn bad_expressions_and_zones_name_their_field() {
        let e = Timetable::new("61 * * * *", "UTC").unwrap_err();
        assert_eq!(e.invalid_field(), Some("cron"), "{e}");
        let e = Timetable::new("* * *", "UTC").unwrap_err();
        assert_eq!(e.invalid_field(), Some("cron"), "{e}");
        let e = Timetable::new("* * * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(e.invalid_field(), Some("time_zone"), "{e}");
    }
}
