//! The ledger the jobs' commands append to (see [`crate::plan::JOB_SCRIPT`]): what
//! actually ran, when, in which process.

use std::collections::BTreeMap;

/// One run of a job's command: an attempt as the machine saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The shell's pid.
    pub pid: u32,
    /// Start, microseconds since the epoch (the machine's realtime clock).
    pub start_us: i64,
    /// End, when the command got that far (a killed command has none).
    pub end_us: Option<i64>,
    /// Its exit code, with its end.
    pub rc: Option<i32>,
}

/// A lock another live process held when a command started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    /// The job whose command saw it.
    pub key: String,
    /// When, microseconds since the epoch.
    pub at_us: i64,
    /// `job`, `group:NAME`, `stage:BATCH-STAGE` or `stage-lock:BATCH-STAGE`.
    pub what: String,
}

/// The ledger, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Runs per job key, by start time.
    pub runs: BTreeMap<String, Vec<Run>>,
    /// Every alarm.
    pub alarms: Vec<Alarm>,
    /// Lines that could not be read (a torn write would show here).
    pub bad_lines: Vec<String>,
}

impl Ledger {
    /// Reads the ledger's text.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut ledger = Ledger::default();
        // (key, pid) → index of its open run.
        let mut open: BTreeMap<(String, u32), usize> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let parsed = match w.as_slice() {
                ["S", key, pid, t] => pid.parse().ok().zip(t.parse().ok()).map(|(pid, t)| {
                    let runs = ledger.runs.entry((*key).to_owned()).or_default();
                    runs.push(Run {
                        pid,
                        start_us: t,
                        end_us: None,
                        rc: None,
                    });
                    open.insert(((*key).to_owned(), pid), runs.len() - 1);
                }),
                ["E", key, pid, t, rc] => {
                    let (Ok(pid), Ok(t), Ok(rc)) = (pid.parse(), t.parse(), rc.parse()) else {
                        ledger.bad_lines.push(line.to_owned());
                        continue;
                    };
                    open.remove(&((*key).to_owned(), pid)).map(|i| {
                        let run = &mut ledger.runs.get_mut(*key).expect("opened")[i];
                        run.end_us = Some(t);
                        run.rc = Some(rc);
                    })
                }
                ["X", key, _pid, t, what] => t.parse().ok().map(|at_us| {
                    ledger.alarms.push(Alarm {
                        key: (*key).to_owned(),
                        at_us,
                        what: (*what).to_owned(),
                    });
                }),
                _ => None,
            };
            if parsed.is_none() {
                ledger.bad_lines.push(line.to_owned());
            }
        }
        for runs in ledger.runs.values_mut() {
            runs.sort_by_key(|r| r.start_us);
        }
        ledger
    }

    /// The runs of `key` (none when it never ran).
    #[must_use]
    pub fn runs_of(&self, key: &str) -> &[Run] {
        self.runs.get(key).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_starts_with_ends_by_pid() {
        let l = Ledger::parse(
            "S k1 10 100\nS k1 11 150\nE k1 11 170 0\nX k2 12 160 group:g0\nE k1 10 120 1\nS k3 13 5\ngarbage\n",
        );
        assert_eq!(
            l.runs_of("k1"),
            &[
                Run {
                    pid: 10,
                    start_us: 100,
                    end_us: Some(120),
                    rc: Some(1)
                },
                Run {
                    pid: 11,
                    start_us: 150,
                    end_us: Some(170),
                    rc: Some(0)
                },
            ]
        );
        assert_eq!(l.runs_of("k3")[0].end_us, None);
        assert_eq!(l.alarms.len(), 1);
        assert_eq!(l.bad_lines, vec!["garbage".to_owned()]);
    }
}
