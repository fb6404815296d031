//! The goals, judged from one run's rows: each goal whose inputs the run
//! measured gets its figure and whether it is met, so a run states its own verdicts
//! (`docs/BENCHMARKS.md`, "Goals", keeps them across runs). The scenario names are
//! the ones the scenario modules print.
//!
//! A drain goal is judged on the medians of the rows (ours over theirs), as the ratios
//! section prints them; the paired rounds of the drain and the raw loop are printed
//! beside the drain rows. The in-memory model is judged on nothing: it is the
//! reference, not a backend anyone deploys.

use std::time::Duration;

use crate::Row;

/// One goal, judged.
#[derive(Debug)]
pub struct Verdict {
    pub goal: String,
    pub figure: String,
    pub met: bool,
}

/// The sweep a peer drains at; its fastest row is the best of these.
const SWEEP: [u32; 4] = [1, 4, 16, 64];
/// `--all` should measure everything within about this long.
const RUN_TIME: Duration = Duration::from_secs(600);
/// A server's drain goals: the share of its raw loop our drain should reach, and the
/// peers it should beat by a factor.
struct Drain {
    server: &'static str,
    share: f64,
    peers: &'static [(&'static str, f64)],
    /// Peers the worker as a user gets it (automatic prefetch) should beat by a factor
    /// at every concurrency of the sweep.
    defaults: &'static [(&'static str, f64)],
}

const DRAINS: [Drain; 2] = [
    Drain {
        server: "postgres",
        share: 0.60,
        peers: &[("graphile-worker", 1.5), ("apalis-postgres", 10.0)],
        defaults: &[("graphile-worker", 1.0), ("apalis-postgres", 3.0)],
    },
    Drain {
        server: "redis",
        share: 0.40,
        peers: &[("apalis-redis", 1.5)],
        defaults: &[],
    },
];

/// The kind of run the rows come from.
pub struct Run {
    /// Everything was run: a drain goal whose rows are missing says "not measured"
    /// instead of being left out.
    pub full: bool,
    /// How long the run measured, when the run-time goal applies (`--all` as it is).
    pub timed: Option<Duration>,
    /// The share of the headline rows' jobs that the sweep's other drains got (1: all
    /// of them; see `--full-counts`).
    pub share: usize,
}

/// The verdicts `rows` allow.
pub fn judge(rows: &[Row], run: &Run) -> Vec<Verdict> {
    let mut out = drains(rows, run);
    for server in ["postgres", "redis"] {
        if let Some(p50) = value(rows, "latency 500/s, enqueue->start p50", server) {
            out.push(at_most(
                format!("{server} enqueue-to-start p50 <= 5 ms"),
                p50,
                5.0,
                format!("{p50:.2} ms"),
            ));
        }
    }
    for r in rows.iter().filter(|r| r.target != "memory") {
        if r.scenario == "stages 20x50, transition p50" {
            out.push(at_most(
                format!("{} stage transition p50 <= 10 ms", r.target),
                r.value,
                10.0,
                format!("{:.2} ms", r.value),
            ));
        }
    }
    out.extend(backlog(rows));
    out.extend(bursts(rows));
    out.extend(phases(rows));
    if let Some(measured) = run.timed {
        out.push(at_most(
            "--all measured within ~10 minutes".to_owned(),
            measured.as_secs_f64(),
            RUN_TIME.as_secs_f64(),
            format!("{} s", measured.as_secs()),
        ));
    }
    out
}

fn value(rows: &[Row], scenario: &str, target: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.target == target)
        .map(|r| r.value)
}

fn at_most(goal: String, value: f64, bound: f64, figure: String) -> Verdict {
    Verdict {
        goal,
        figure,
        met: value <= bound,
    }
}

/// A ratio goal; the figure has enough digits that a miss never prints as the bound.
fn at_least(goal: String, ratio: f64, bound: f64, percent: bool) -> Verdict {
    let figure = if percent {
        format!("{:.2}%", ratio * 100.0)
    } else {
        format!("{ratio:.3}x")
    };
    Verdict {
        goal,
        figure,
        met: ratio >= bound,
    }
}

fn not_measured(goal: String) -> Verdict {
    Verdict {
        goal,
        figure: "not measured".to_owned(),
        met: false,
    }
}

/// Our prefetch drain against the raw loop and each peer's concurrency-16 and fastest
/// rows (the fastest only when the peer ran the whole sweep, labelled with its share of
/// the jobs when that row drained fewer than ours).
fn drains(rows: &[Row], run: &Run) -> Vec<Verdict> {
    let full = run.full;
    let mut out = Vec::new();
    for Drain {
        server,
        share,
        peers,
        defaults,
    } in DRAINS
    {
        // The fixed prefetch's row, not the floor's (`prefetch 0`).
        let ours = rows
            .iter()
            .find(|r| {
                r.target == server
                    && r.scenario.starts_with("drain, concurrency 16, prefetch ")
                    && !r.scenario.ends_with(" prefetch 0")
            })
            .map(|r| r.value);
        let raw = value(rows, "raw drain, 16 loops of 50", server);
        let goal = format!("{server} drain >= {:.0}% of its raw loop", share * 100.0);
        match (ours, raw) {
            (Some(ours), Some(raw)) => out.push(at_least(goal, ours / raw, share, true)),
            _ if full => out.push(not_measured(goal)),
            _ => {}
        }
        for &(peer, times) in peers {
            let sweep: Vec<(u32, f64)> = SWEEP
                .iter()
                .filter_map(|&c| Some((c, value(rows, &format!("drain, concurrency {c}"), peer)?)))
                .collect();
            let goal = format!("{server} drain >= {times}x {peer} at concurrency 16");
            match (ours, sweep.iter().find(|(c, _)| *c == 16)) {
                (Some(ours), Some(&(_, c16))) => out.push(at_least(goal, ours / c16, times, false)),
                _ if full => out.push(not_measured(goal)),
                _ => {}
            }
            let fastest = sweep.iter().max_by(|a, b| a.1.total_cmp(&b.1));
            if let (Some(ours), Some(&(c, best)), true) =
                (ours, fastest, sweep.len() == SWEEP.len())
            {
                // Concurrency 16 drains as many jobs as our headline row; the others
                // too with `--full-counts`.
                let count = if c == 16 || run.share == 1 {
                    String::new()
                } else {
                    format!(", on 1/{} of the jobs", run.share)
                };
                let goal = format!("{server} drain >= {times}x {peer} at its fastest ({c}{count})");
                out.push(at_least(goal, ours / best, times, false));
            }
        }
        out.extend(by_default(rows, server, defaults, run));
    }
    out
}

/// The default worker's sweep rows against each peer's at the same concurrency.
fn by_default(rows: &[Row], server: &str, peers: &[(&str, f64)], run: &Run) -> Vec<Verdict> {
    let mut out = Vec::new();
    for &(peer, times) in peers {
        for c in SWEEP {
            let name = format!("drain, concurrency {c}");
            // Concurrency 16 drains all the jobs; the others with `--full-counts`.
            let count = if c == 16 || run.share == 1 {
                String::new()
            } else {
                format!(", on 1/{} of the jobs", run.share)
            };
            let goal =
                format!("{server} default worker >= {times}x {peer} at concurrency {c}{count}");
            match (value(rows, &name, server), value(rows, &name, peer)) {
                (Some(ours), Some(theirs)) => {
                    out.push(at_least(goal, ours / theirs, times, false));
                }
                _ if run.full => out.push(not_measured(goal)),
                _ => {}
            }
        }
    }
    out
}

/// Claim p50 at the largest backlog against the smallest, per target.
fn backlog(rows: &[Row]) -> Vec<Verdict> {
    let sized = |r: &Row| -> Option<u64> {
        let rest = r.scenario.strip_prefix("claim 5 with ")?;
        let (n, what) = rest.split_once(" pending, ")?;
        if what != "p50" {
            return None;
        }
        n.parse().ok()
    };
    // In the order the run measured them (sizes come one after another).
    let mut targets: Vec<&str> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.target != "memory" && sized(r).is_some())
    {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let mut out = Vec::new();
    for t in targets {
        let mut sizes: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| r.target == t)
            .filter_map(|r| Some((sized(r)?, r.value)))
            .collect();
        sizes.sort_by_key(|&(n, _)| n);
        if let (Some(&(small, a)), Some(&(large, b))) = (sizes.first(), sizes.last())
            && large > small
        {
            let goal = format!("{t} claim p50 at {large} pending <= 1.5x at {small}");
            out.push(at_most(goal, b / a, 1.5, format!("{:.3}x", b / a)));
        }
    }
    out
}

/// The claims of a burst after the drained tables were analyzed are as fast as the
/// first drain's (p50 within 1.5x), on each SQL backend measured: statistics taken of
/// a drained table must not make the next burst's claims read the whole table.
fn bursts(rows: &[Row]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.scenario.ends_with("first drain, claim p50"))
    {
        let after = r.scenario.replace("first drain", "burst after analyze");
        if let Some(b) = value(rows, &after, &r.target) {
            let goal = format!(
                "{} burst claim p50 after analyze <= 1.5x first drain's",
                r.target
            );
            out.push(at_most(
                goal,
                b / r.value,
                1.5,
                format!("{:.3}x", b / r.value),
            ));
        }
    }
    out
}

/// A producer under churn while vacuum is held back, for PostgreSQL with the worker's
/// defaults, at each rate measured: every phase completes within 2% of the producer's
/// rate; while a transaction or REPEATABLE READ readers pin the horizon, claims and
/// pickups stay under 100 ms at p99; the backlog is gone within 5 s of the last of them
/// ending.
fn phases(rows: &[Row]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.target == "postgres") {
        let Some(rest) = r.scenario.strip_prefix("phases ") else {
            continue;
        };
        let Some((rate, what)) = rest.split_once("/s, ") else {
            continue;
        };
        let Ok(rate) = rate.parse::<f64>() else {
            continue;
        };
        let goal = |g: &str| format!("postgres phases {rate}/s, {g}");
        match what.split_once(": ") {
            Some((phase, "done/s mean")) => out.push(at_least(
                goal(&format!("{phase}: done/s >= 98% of the rate")),
                r.value / rate,
                0.98,
                true,
            )),
            Some((phase @ ("idle-in-tx" | "rr-readers"), what @ ("claim p99" | "pickup p99"))) => {
                out.push(at_most(
                    goal(&format!("{phase}: {what} <= 100 ms")),
                    r.value,
                    100.0,
                    format!("{:.1} ms", r.value),
                ));
            }
            Some((phase @ ("recovery" | "rr-recovery"), "backlog gone after")) => {
                out.push(at_most(
                    goal(&format!("{phase}: backlog gone within 5 s")),
                    r.value,
                    5.0,
                    format!("{} s", r.value),
                ))
            }
            _ => {}
        }
    }
    out
}

/// Prints the verdicts under the ratios.
#[allow(clippy::print_stdout)]
pub fn print(verdicts: &[Verdict]) {
    if verdicts.is_empty() {
        return;
    }
    println!("\ngoals (the issue's; docs/BENCHMARKS.md keeps them across runs)");
    for v in verdicts {
        let status = if v.met { "met" } else { "MISSED" };
        println!("  {:<58} {:>12}  {status}", v.goal, v.figure);
    }
}

#[cfg(test)]
mod tests;
