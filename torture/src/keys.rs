//! The limit-key checks (SPEC K2): no more jobs of a key ran at once than its limit,
//! in the ledger (the commands' start and end lines) and in the database (each
//! attempt from its claim to its end).
//!
//! A command killed before its end line (its worker killed, or frozen past its lease
//! and stopped by its guard) is left out, as the group check leaves it out: its end is
//! unknown. So is an attempt with no end in the log.

use std::collections::BTreeSet;

use crate::{
    check::{Check, Observed},
    ledger::Ledger,
    plan::{KEY_LIMITS, Plan},
};

/// The names of the checks.
pub mod names {
    /// No more commands of a key ran at once than its limit (ledger).
    pub const RUNS: &str = "limit key: runs within limit";
    /// No more attempts of a key were running at once than its limit (database).
    pub const CLAIMS: &str = "limit key: claims within limit";
}

/// Violation lines kept per key and check, at most.
const SHOWN: usize = 5;

/// Both checks. `excused(jobs)` says whether an overlap among these plan indexes is
/// excused (a claim the server forgot in a crash).
#[must_use]
pub fn check(
    plan: &Plan,
    obs: &Observed,
    ledger: &Ledger,
    excused: &dyn Fn(&[usize]) -> bool,
) -> [Check; 2] {
    let mut runs = Check::new(names::RUNS, 0);
    let mut claims = Check::new(names::CLAIMS, 0);
    for &(key, limit) in KEY_LIMITS {
        let members: Vec<usize> = (0..plan.jobs.len())
            .filter(|&i| plan.jobs[i].limit_key == Some(key))
            .collect();
        let mut spans = Vec::new();
        for &i in &members {
            for r in ledger.runs_of(&plan.jobs[i].key) {
                if let Some(end) = r.end_us {
                    spans.push((r.start_us, end, i));
                }
            }
        }
        runs.checked += spans.len();
        sweep(key, limit, &spans, "ran", excused, &mut runs);
        let mut spans = Vec::new();
        for &i in &members {
            let Some(info) = obs.jobs.get(i).and_then(Option::as_ref) else {
                continue;
            };
            for a in &info.attempt_log {
                if let Some(end) = a.ended_at {
                    spans.push((a.claimed().timestamp_micros(), end.timestamp_micros(), i));
                }
            }
        }
        claims.checked += spans.len();
        sweep(key, limit, &spans, "were claimed", excused, &mut claims);
    }
    [runs, claims]
}

/// Counts the spans (start, end, plan index) open at each moment; each moment above
/// `limit` is a line of `check`.
fn sweep(
    key: &str,
    limit: u32,
    spans: &[(i64, i64, usize)],
    what: &str,
    excused: &dyn Fn(&[usize]) -> bool,
    check: &mut Check,
) {
    // Ends before starts at one instant: a slot freed and taken at once.
    let mut edges: Vec<(i64, bool, usize, usize)> = spans
        .iter()
        .enumerate()
        .flat_map(|(n, &(s, e, i))| [(s, true, n, i), (e, false, n, i)])
        .collect();
    edges.sort_unstable();
    let mut open: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut shown = 0;
    for (at, start, n, i) in edges {
        if !start {
            open.remove(&(n, i));
            continue;
        }
        open.insert((n, i));
        if open.len() > limit as usize && shown < SHOWN {
            shown += 1;
            let jobs: Vec<usize> = open.iter().map(|&(_, i)| i).collect();
            let line = format!(
                "key {key} (limit {limit}): {} jobs {what} at once at {at} µs (plan indexes {jobs:?})",
                open.len()
            );
            check.push(line, excused(&jobs));
        }
    }
}
