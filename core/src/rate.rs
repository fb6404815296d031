//! [`Rate`]: at most `count` starts per `per`, the rate limit of a queue (SPEC K8).

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// At most `count` jobs of a queue start in any window of length `per`, across all
/// workers, timed by the server's clock (SPEC K8, K9). `burst` of them may start at
/// once; the rest follow, evenly spaced.
///
/// ```
/// use relayq_core::Rate;
/// let rate: Rate = "100/1s".parse().unwrap();
/// assert_eq!(rate, Rate::new(100, std::time::Duration::from_secs(1)));
/// assert_eq!(rate.with_burst(10).to_string(), "100/1s burst 10");
/// assert_eq!("100/1s burst 10".parse::<Rate>().unwrap(), rate.with_burst(10));
/// // In JSON as text.
/// assert_eq!(serde_json::to_string(&rate).unwrap(), r#""100/1s""#);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Rate {
    /// Starts per window, 1..=1,000,000.
    pub count: u32,
    /// The window's length, 1 ms to 1 day.
    pub per: Duration,
    /// How many may start at once, 1..=`count` (default [`Rate::default_burst`]).
    /// Under a steady backlog `count - burst + 1` start per window: a burst trades a
    /// little of the rate for claims of many jobs at once.
    pub burst: u32,
}

impl Rate {
    /// `count` starts per `per`, with the default burst.
    #[must_use]
    pub fn new(count: u32, per: Duration) -> Self {
        Self {
            count,
            per,
            burst: Self::default_burst(count),
        }
    }

    /// The default burst: 1 % of `count`, at least 1. So a rate below 200 starts its
    /// jobs one at a time, evenly spaced, `count` per window; a higher one lets a claim
    /// take up to 1 % of it at once (a claim is otherwise one job, whatever the rate)
    /// and starts 99 % of `count` per window under a backlog, less the rounding of
    /// the time between starts up to whole microseconds ([`kit::rate`](crate::kit::rate)).
    #[must_use]
    pub fn default_burst(count: u32) -> u32 {
        (count / 100).max(1)
    }

    /// Lets `burst` jobs start at once.
    #[must_use]
    pub fn with_burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// The time between two starts under a backlog, in microseconds, rounded up so
    /// that no window of `per` holds more than `count` starts (SPEC K9).
    #[must_use]
    pub fn emission_us(&self) -> i64 {
        let per = i64::try_from(self.per.as_micros()).unwrap_or(i64::MAX);
        let spaced = i64::from(self.count.saturating_sub(self.burst).saturating_add(1));
        (per + spaced - 1) / spaced.max(1)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.per.as_millis();
        let (n, unit) = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1_000, "s"),
        ]
        .into_iter()
        .find(|(u, _)| ms >= *u && ms.is_multiple_of(*u))
        .map_or((ms, "ms"), |(u, name)| (ms / u, name));
        write!(f, "{}/{n}{unit}", self.count)?;
        if self.burst != Self::default_burst(self.count) {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// As text (`10/1s`, `100/1s burst 5`), in JSON as elsewhere.
impl From<Rate> for String {
    fn from(rate: Rate) -> Self {
        rate.to_string()
    }
}

impl TryFrom<String> for Rate {
    type Error = Error;

    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

/// `N/1s`, `N/500ms`, `N/2m`, `N/1h`, `N/1d` (a bare unit means 1 of it: `N/s`),
/// optionally followed by ` burst B`, as [`Display`](fmt::Display) writes it.
impl FromStr for Rate {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::invalid("rate", format!("{s:?} is not N/interval, like 10/1s"));
        let (s, burst) = match s.trim().split_once(" burst ") {
            Some((rate, burst)) => (rate, Some(burst.trim().parse::<u32>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let (count, per) = s.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let per = per.trim();
        let split = per.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (n, unit) = per.split_at(split);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse().map_err(|_| bad())?
        };
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        let per = Duration::from_millis(n.checked_mul(unit_ms).ok_or_else(bad)?);
        let mut rate = Self::new(count, per);
        if let Some(b) = burst {
            rate = rate.with_burst(b);
        }
        crate::validate::rate(&rate)?;
        Ok(rate)
    }
}
