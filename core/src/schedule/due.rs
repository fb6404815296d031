//! Which slot of a schedule is due, under its missed-slot policy (SPEC S2, S3).

use chrono::{DateTime, TimeDelta, Utc};

use super::{Missed, Timetable};

/// How late a slot may be found and still run under [`Missed::Skip`]: a scheduler
/// checks every second, so a slot found later than this was missed.
pub const ON_TIME: TimeDelta = TimeDelta::seconds(60);

/// What to do next for one schedule, given its mark and the server's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Enqueue this slot.
    Fire(DateTime<Utc>),
    /// Move the mark to this slot and enqueue nothing: the policy runs none of the
    /// slots up to it.
    Skip(DateTime<Utc>),
    /// Nothing is due; the next slot comes then (`None`: never).
    Wait(Option<DateTime<Utc>>),
}

/// The schedule's next step: `mark` is its last slot handled, `now` the server's time.
pub(crate) fn due(t: &Timetable, mark: DateTime<Utc>, now: DateTime<Utc>, missed: Missed) -> Due {
    let Some(first) = t.next_after(mark) else {
        return Due::Wait(None);
    };
    if first > now {
        return Due::Wait(Some(first));
    }
    // At least one slot is due: `last` is the latest, `first` the earliest unhandled.
    let last = t.last_until(now).filter(|l| *l >= first).unwrap_or(first);
    match missed {
        Missed::Latest => Due::Fire(last),
        Missed::Skip if now - last <= ON_TIME => Due::Fire(last),
        Missed::Skip => Due::Skip(last),
        Missed::All { within_secs } => {
            let floor = now - TimeDelta::seconds(i64::try_from(within_secs).unwrap_or(i64::MAX));
            if first >= floor {
                return Due::Fire(first);
            }
            match t.next_from(floor) {
                Some(s) if s <= now => Due::Fire(s),
                _ => Due::Skip(last),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 5, 1, h, m, s).unwrap()
    }

    fn hourly() -> Timetable {
        Timetable::new("0 * * * *", "UTC").unwrap()
    }

    #[test]
    fn nothing_is_due_before_the_next_slot() {
        assert_eq!(
            due(&hourly(), at(10, 0, 0), at(10, 59, 59), Missed::Latest),
            Due::Wait(Some(at(11, 0, 0)))
        );
    }

    #[test]
    fn a_slot_is_due_at_its_time() {
        for missed in [
            Missed::Latest,
            Missed::Skip,
            Missed::All { within_secs: 60 },
        ] {
            assert_eq!(
                due(&hourly(), at(10, 0, 0), at(11, 0, 0), missed),
                Due::Fire(at(11, 0, 0)),
                "{missed:?}"
            );
        }
    }

    #[test]
    fn latest_runs_the_most_recent_missed_slot() {
        assert_eq!(
            due(&hourly(), at(5, 0, 0), at(10, 30, 0), Missed::Latest),
            Due::Fire(at(10, 0, 0))
        );
    }

    #[test]
    fn skip_runs_no_late_slot() {
        assert_eq!(
            due(&hourly(), at(5, 0, 0), at(10, 30, 0), Missed::Skip),
            Due::Skip(at(10, 0, 0))
        );
        assert_eq!(
            due(&hourly(), at(5, 0, 0), at(10, 0, 30), Missed::Skip),
            Due::Fire(at(10, 0, 0))
        );
    }

    #[test]
    fn latest_after_a_daylight_saving_change_fires_one_real_slot() {
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        let utc = |d, h, m| Utc.with_ymd_and_hms(2026, 3, d, h, m, 0).unwrap();
        // Missed since before the 28th; now just after the shifted 03:00 CEST.
        let now = utc(29, 1, 5);
        let Due::Fire(slot) = due(&t, utc(27, 12, 0), now, Missed::Latest) else {
            panic!("a slot is due");
        };
        assert_eq!(slot, utc(29, 1, 0));
        assert_eq!(
            due(&t, slot, now, Missed::Latest),
            Due::Wait(Some(utc(30, 0, 30)))
        );
        let autumn = Timetable::new("*/15 * * * *", "Europe/Berlin").unwrap();
        let at = |h, m| Utc.with_ymd_and_hms(2026, 10, 25, h, m, 0).unwrap();
        let Due::Fire(slot) = due(&autumn, at(0, 0), at(1, 20), Missed::Latest) else {
            panic!("a slot is due");
        };
        // The repeated hour runs no local time twice: 02:45 CEST is the latest.
        assert_eq!(slot, at(0, 45), "the latest, once");
        assert!(matches!(
            due(&autumn, slot, at(1, 20), Missed::Latest),
            Due::Wait(_)
        ));
    }

    #[test]
    fn all_runs_missed_slots_in_order_within_the_bound() {
        let two_hours = Missed::All {
            within_secs: 2 * 3600,
        };
        // Slots 6..=10 were missed; only those from 8:30 on are within two hours.
        assert_eq!(
            due(&hourly(), at(5, 0, 0), at(10, 30, 0), two_hours),
            Due::Fire(at(9, 0, 0))
        );
        assert_eq!(
            due(&hourly(), at(9, 0, 0), at(10, 30, 0), two_hours),
            Due::Fire(at(10, 0, 0))
        );
        let ten_minutes = Missed::All { within_secs: 600 };
        assert_eq!(
            due(&hourly(), at(5, 0, 0), at(10, 30, 0), ten_minutes),
            Due::Skip(at(10, 0, 0))
        );
    }
}
