//! How counts and durations read in messages: "1 job", "2 jobs"; "148 ms", "7 days".

use std::time::Duration;

/// `n` and `what`, plural unless `n` is 1: `plural(1, "job")` is "1 job".
pub fn plural(n: impl TryInto<u64>, what: &str) -> String {
    match n.try_into().unwrap_or(u64::MAX) {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// A duration as a person reads it, to a sensible precision: "148 ms", "1.5 s",
/// "2 min 5 s", "3 h 20 min", "7 days".
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        0 if ms == 0 && !d.is_zero() => format!("{} µs", d.as_micros()),
        0 => format!("{ms} ms"),
        1..60 => {
            let tenths = (ms + 50) / 100;
            if tenths >= 600 {
                // 59.96 s rounds to a minute.
                return duration(Duration::from_secs(60));
            }
            if tenths.is_multiple_of(10) {
                format!("{} s", tenths / 10)
            } else {
                format!("{}.{} s", tenths / 10, tenths % 10)
            }
        }
        60..3600 => with_rest(s / 60, "min", s % 60, "s"),
        3600..86_400 => with_rest(s / 3600, "h", s % 3600 / 60, "min"),
        _ => {
            let days = plural(s / 86_400, "day");
            match s % 86_400 / 3600 {
                0 => days,
                h => format!("{days} {h} h"),
            }
        }
    }
}

fn with_rest(n: u64, unit: &str, rest: u64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{n} {unit}")
    } else {
        format!("{n} {unit} {rest} {rest_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_with_their_noun() {
        assert_eq!(plural(1_usize, "job"), "1 job");
        assert_eq!(plural(0u32, "job"), "0 jobs");
        assert_eq!(plural(2u64, "job"), "2 jobs");
    }

    #[test]
    fn durations_read_as_a_person_writes_them() {
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        assert_eq!(duration(Duration::from_nanos(148_097_491)), "148 ms");
        assert_eq!(duration(Duration::from_micros(40)), "40 µs");
        assert_eq!(duration(Duration::ZERO), "0 ms");
        assert_eq!(duration(ms(1500)), "1.5 s");
        assert_eq!(duration(secs(30)), "30 s");
        assert_eq!(duration(ms(59_960)), "1 min");
        assert_eq!(duration(secs(125)), "2 min 5 s");
        assert_eq!(duration(secs(3600)), "1 h");
        assert_eq!(duration(secs(12_000)), "3 h 20 min");
        assert_eq!(duration(secs(7 * 86_400)), "7 days");
        assert_eq!(duration(secs(86_400 + 7200)), "1 day 2 h");
    }
}
