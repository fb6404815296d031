//! The key-rate cell (SPEC K12, K13): a queue of its own whose limit keys have rates, a
//! default of [`DEFAULT`] for every key and [`OWN`] of its own for the first, with a
//! limit of 1 on the last as well, served by every `relayq work` process of the run
//! under its faults (SIGKILLs, SIGSTOPs past the lease, server crashes and restarts).
//!
//! Checked at the end from the database, as the rate cell checks its queue: each
//! attempt's claim, on the server's clock, counted per key in every window of the
//! key's interval; more than the key's count in one is a violation, and so is a job
//! not finished. An attempt whose claim the server forgot in a crash is not counted.
//!
//! The same queue holds a backlog first: [`BACKLOG`] jobs of a key of limit 1 in one
//! enqueue, enough that SQLite, PostgreSQL and Redis set some of them aside as they
//! arrive (SPEC K4). Each must succeed (none left parked), and no two of its attempts
//! may overlap between claim and end (database).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::TimeDelta;
use relayq::{Backend, JobId, JobState, NewJob, Rate};

use crate::{check::Check, run::queue};

/// Every key's rate without one of its own.
pub const DEFAULT: Rate = Rate {
    count: 4,
    per: Duration::from_secs(1),
    burst: 1,
};
/// The first key's own rate.
pub const OWN: Rate = Rate {
    count: 3,
    per: Duration::from_secs(1),
    burst: 2,
};
/// The cell's keys; the first has [`OWN`], the last a limit of 1 besides.
const KEYS: [&str; 3] = ["kr0", "kr1", "kr2"];
/// Jobs per key: about three windows' worth.
const PER_KEY: usize = 10;
/// The backlog key, of limit 1, and its jobs, enqueued at once.
const BACKLOG_KEY: &str = "krb";
const BACKLOG: usize = 80;

/// The backlog's check's name.
pub const BACKLOG_NAME: &str = "key backlog: none left parked, limit kept";

/// The check's name.
pub const NAME: &str = "key rate: claims within each key's rate";

/// The cell of one run: its queue and jobs, or none when the backend keeps no key
/// rates.
pub struct Cell {
    /// The queue the workers must serve.
    pub queue: String,
    ids: Vec<(JobId, &'static str)>,
    backlog: Vec<JobId>,
}

fn rate_of(key: &str) -> Rate {
    if key == KEYS[0] { OWN } else { DEFAULT }
}

/// Sets the cell's key rates and enqueues its jobs, the keys interleaved.
///
/// # Errors
/// When the backend refuses them for a minute.
pub async fn start(backend: &dyn Backend) -> anyhow::Result<Cell> {
    let q = format!("{}.krate", queue());
    let limits = backend.limits();
    if !(limits.rates && limits.limit_keys) {
        return Ok(Cell {
            queue: q,
            ids: Vec::new(),
            backlog: Vec::new(),
        });
    }
    crate::run::retry("set the cell's default key rate", || {
        backend.set_key_rate(&q, None, Some(DEFAULT))
    })
    .await?;
    crate::run::retry("set the cell's own key rate", || {
        backend.set_key_rate(&q, Some(KEYS[0]), Some(OWN))
    })
    .await?;
    crate::run::retry("set the cell's key limit", || {
        backend.set_key_limit(&q, Some(KEYS[2]), Some(1))
    })
    .await?;
    crate::run::retry("set the backlog's key limit", || {
        backend.set_key_limit(&q, Some(BACKLOG_KEY), Some(1))
    })
    .await?;
    let backlog: Vec<NewJob> = (0..BACKLOG)
        .map(|i| {
            let payload = serde_json::json!({"command": "true", "name": format!("krb-{i}")});
            NewJob::new(&q, payload.to_string().into_bytes())
                .limit_key(BACKLOG_KEY)
                .max_attempts(25)
        })
        .collect();
    let backlog = crate::run::retry("enqueue the backlog", || backend.enqueue(backlog.clone()))
        .await?
        .into_iter()
        .map(|e| e.id)
        .collect();
    let keys: Vec<&'static str> = (0..PER_KEY).flat_map(|_| KEYS).collect();
    let jobs: Vec<NewJob> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let payload =
                serde_json::json!({"command": "true", "name": format!("krate-{key}-{i}")});
            NewJob::new(&q, payload.to_string().into_bytes())
                .limit_key(*key)
                .max_attempts(25)
        })
        .collect();
    let got =
        crate::run::retry("enqueue the cell's jobs", || backend.enqueue(jobs.clone())).await?;
    Ok(Cell {
        queue: q,
        ids: got.into_iter().map(|e| e.id).zip(keys).collect(),
        backlog,
    })
}

impl Cell {
    /// Whether every job of the cell has finished (the run waits for them).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn finished(&self, backend: &dyn Backend) -> anyhow::Result<bool> {
        let stats = backend.queue_stats(&self.queue).await?;
        Ok(stats.total() == stats.count(JobState::Succeeded) + stats.count(JobState::Dead))
    }

    /// Checks each key's claims against its rate, once the workers have stopped.
    ///
    /// # Errors
    /// When the database cannot be read for a minute.
    pub async fn check(&self, backend: &dyn Backend) -> anyhow::Result<(Check, String)> {
        let mut check = Check::new(NAME, 0);
        if self.ids.is_empty() {
            return Ok((check, "not run: the backend keeps no key rates".into()));
        }
        let mut claims: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for &(id, key) in &self.ids {
            let info = crate::run::retry("job", || backend.job(&self.queue, id)).await?;
            if info.state != JobState::Succeeded {
                check
                    .violations
                    .push(format!("job {id} ended {} (want succeeded)", info.state));
            }
            claims
                .entry(key)
                .or_default()
                .extend(info.attempt_log.iter().map(relayq::AttemptRecord::claimed));
        }
        let mut notes = Vec::new();
        for (key, claims) in &mut claims {
            claims.sort_unstable();
            check.checked += claims.len();
            let rate = rate_of(key);
            let window = TimeDelta::from_std(rate.per)?;
            let mut worst = 0;
            for (i, &t) in claims.iter().enumerate() {
                let within = claims[i..].iter().take_while(|&&c| c < t + window).count();
                worst = worst.max(within);
                if within > rate.count as usize && check.violations.len() < 5 {
                    check.violations.push(format!(
                        "key {key}: {within} claims in the {:?} from {t} under {rate}",
                        rate.per
                    ));
                }
            }
            notes.push(format!("{key} at most {worst} per window under {rate}"));
        }
        Ok((check, notes.join("; ")))
    }

    /// Checks the backlog: every job succeeded, and its attempts, each from its claim
    /// to its end, never overlap (a limit of 1).
    ///
    /// # Errors
    /// When the database cannot be read for a minute.
    pub async fn check_backlog(&self, backend: &dyn Backend) -> anyhow::Result<Check> {
        let mut check = Check::new(BACKLOG_NAME, self.backlog.len());
        let mut spans = Vec::new();
        for &id in &self.backlog {
            let info = crate::run::retry("job", || backend.job(&self.queue, id)).await?;
            if info.state != JobState::Succeeded && check.violations.len() < 5 {
                check
                    .violations
                    .push(format!("job {id} ended {} (want succeeded)", info.state));
            }
            spans.extend(
                info.attempt_log
                    .iter()
                    .filter_map(|a| Some((a.claimed(), a.ended_at?, id))),
            );
        }
        spans.sort_unstable();
        for pair in spans.windows(2) {
            let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
            if start < end && check.violations.len() < 5 {
                check.violations.push(format!(
                    "key {BACKLOG_KEY} (limit 1): job {b} claimed at {start} while job {a} ran to {end}"
                ));
            }
        }
        Ok(check)
    }
}
