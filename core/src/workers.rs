//! Who serves a queue: each worker's beat, and the beats a queue has seen (SPEC M9).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{Error, Result, validate};

/// How often a running worker beats for each queue it serves.
pub const BEAT_EVERY: Duration = Duration::from_secs(5);

/// How long a worker that stopped beating stays listed: long enough to see that it
/// went away and when.
pub const BEAT_KEPT: Duration = Duration::from_secs(3600);

/// The most queues a beat names.
pub const MAX_BEAT_QUEUES: usize = 100;

/// What a worker says of itself, every [`BEAT_EVERY`], to each queue it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerBeat {
    /// Its name (as in the attempt log).
    pub worker: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// Every queue it serves.
    pub queues: Vec<String>,
    /// How many jobs it runs at once.
    pub slots: u32,
    /// Slots running a handler now, for any of its queues.
    pub busy: u32,
    /// Jobs of this queue it claimed ahead that wait in its buffer for a slot: they
    /// hold a lease, but no handler runs them yet.
    pub held: u32,
    /// When it started, by its own clock.
    pub started_at: DateTime<Utc>,
}

impl WorkerBeat {
    /// Checks the fields a backend stores.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `worker`, `host`, `queues` or `slots`.
    pub fn validate(&self) -> Result<()> {
        validate::label("worker", &self.worker)?;
        validate::label("host", &self.host)?;
        if self.queues.len() > MAX_BEAT_QUEUES {
            return Err(Error::invalid(
                "queues",
                format!("at most {MAX_BEAT_QUEUES} names, got {}", self.queues.len()),
            ));
        }
        for q in &self.queues {
            validate::queue_name(q)
                .map_err(|_| Error::invalid("queues", format!("{q:?} is not a queue name")))?;
        }
        if self.slots == 0 {
            return Err(Error::invalid("slots", "must be at least 1"));
        }
        Ok(())
    }

    /// The beat as stored: JSON text.
    #[must_use]
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("a beat always serializes")
    }

    /// A stored beat; `None` for text this version cannot read.
    #[must_use]
    pub fn from_stored(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// A worker's last beat to a queue, with when the backend took it (server time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSeen {
    /// What it said.
    #[serde(flatten)]
    pub beat: WorkerBeat,
    /// When it said it.
    pub last_seen: DateTime<Utc>,
}

impl WorkerSeen {
    /// Whether it beat within three beats' time before `now`: a worker that missed
    /// that many is taken for gone.
    #[must_use]
    pub fn alive(&self, now: DateTime<Utc>) -> bool {
        (now - self.last_seen).to_std().unwrap_or_default() <= BEAT_EVERY * 3
    }
}

/// This machine's name, for beats: `$HOSTNAME`, else the kernel's, else `unknown`.
#[must_use]
pub fn host_name() -> String {
    let found = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = found
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(255)
        .collect();
    if clean.is_empty() {
        "unknown".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat() -> WorkerBeat {
        WorkerBeat {
            worker: "w1".into(),
            host: host_name(),
            pid: 7,
            queues: vec!["a".into(), "b".into()],
            slots: 4,
            busy: 2,
            held: 1,
            started_at: Utc::now(),
        }
    }

    #[test]
    fn a_beat_is_stored_as_text_and_read_back() {
        let b = beat();
        assert_eq!(WorkerBeat::from_stored(&b.to_stored()), Some(b));
        assert_eq!(WorkerBeat::from_stored("not json"), None);
    }

    #[test]
    fn bad_beats_name_their_field() {
        type Spoil = fn(&mut WorkerBeat);
        let cases: [(Spoil, &str); 4] = [
            (|b| b.worker.clear(), "worker"),
            (|b| b.host = "a\nb".into(), "host"),
            (|b| b.queues = vec!["bad name!".into()], "queues"),
            (|b| b.slots = 0, "slots"),
        ];
        for (spoil, field) in cases {
            let mut b = beat();
            spoil(&mut b);
            assert_eq!(b.validate().unwrap_err().invalid_field(), Some(field));
        }
        assert!(beat().validate().is_ok());
        assert!(!host_name().is_empty());
    }

    #[test]
    fn a_worker_is_alive_for_three_beats() {
        let now = Utc::now();
        let seen = |ago: Duration| WorkerSeen {
            beat: beat(),
            last_seen: now - chrono::TimeDelta::from_std(ago).unwrap(),
        };
        assert!(seen(BEAT_EVERY * 3).alive(now));
        assert!(!seen(BEAT_EVERY * 3 + Duration::from_secs(1)).alive(now));
    }
}
