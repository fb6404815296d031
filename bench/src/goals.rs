//! The goals, judged from one run's rows: each goal whose inputs the run
//! measured gets its figure and whether it is met, so a run states its own verdicts
//! (`docs/BENCHMARKS.md`, "Goals", keeps them across runs).
//!
//! A drain goal is judged on the medians of the rows (ours over theirs), as the ratios
//! section prints them; the paired rounds of the drain and the raw loop are printed
//! beside the drain rows.

use std::time::Duration;

use crate::Row;

/// One goal, judged.
#[derive(Debug, PartialEq)]
pub struct Verdict {
    pub goal: String,
    pub figure: String,
    pub met: bool,
}

/// The sweep a peer drains at; its fastest row is the best of these.
const SWEEP: [u32; 4] = [1, 4, 16, 64];
/// `--all` should measure everything within about this long.
const RUN_TIME: Duration = Duration::from_secs(600);

/// The verdicts `rows` allow. `measured` is how long the run measured; it is judged
/// only for a run of everything (`full`).
pub fn judge(rows: &[Row], measured: Duration, full: bool) -> Vec<Verdict> {
    let find = |scenario: &str, target: &str| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.target == target)
            .map(|r| r.value)
    };
    let starting = |prefix: &str, target: &str| {
        rows.iter()
            .find(|r| r.scenario.starts_with(prefix) && r.target == target)
            .map(|r| r.value)
    };
    let mut out = Vec::new();
    for (server, floor, peers) in [
        (
            "postgres",
            0.60,
            &[("graphile-worker", 1.5), ("apalis-postgres", 10.0)][..],
        ),
        ("redis", 0.40, &[("apalis-redis", 1.5)][..]),
    ] {
        let Some(ours) = starting("drain, concurrency 16, prefetch", server) else {
            continue;
        };
        if let Some(raw) = starting("raw drain", server) {
            let ratio = ours / raw;
            out.push(Verdict {
                goal: format!("{server} drain >= {:.0}% of its raw loop", floor * 100.0),
                figure: format!("{:.1}%", ratio * 100.0),
                met: ratio >= floor,
            });
        }
        for &(peer, times) in peers {
            let sweep: Vec<(u32, f64)> = SWEEP
                .iter()
                .filter_map(|&c| Some((c, find(&format!("drain, concurrency {c}"), peer)?)))
                .collect();
            if let Some(&(_, c16)) = sweep.iter().find(|(c, _)| *c == 16) {
                out.push(Verdict {
                    goal: format!("{server} drain >= {times}x {peer} at concurrency 16"),
                    figure: format!("{:.2}x", ours / c16),
                    met: ours / c16 >= times,
                });
            }
            if let Some(&(c, best)) = sweep.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
                out.push(Verdict {
                    goal: format!("{server} drain >= {times}x {peer} at its fastest ({c})"),
                    figure: format!("{:.2}x", ours / best),
                    met: ours / best >= times,
                });
            }
        }
    }
    for server in ["postgres", "redis"] {
        if let Some(p50) = find("latency 500/s, enqueue->start p50", server) {
            out.push(Verdict {
                goal: format!("{server} enqueue-to-start p50 <= 5 ms"),
                figure: format!("{p50:.2} ms"),
                met: p50 <= 5.0,
            });
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.scenario == "stages 20x50, transition p50")
    {
        out.push(Verdict {
            goal: format!("{} stage transition p50 <= 10 ms", r.target),
            figure: format!("{:.2} ms", r.value),
            met: r.value <= 10.0,
        });
    }
    out.extend(backlog(rows));
    if full {
        out.push(Verdict {
            goal: "--all measured within ~10 minutes".to_owned(),
            figure: format!("{} s", measured.as_secs()),
            met: measured <= RUN_TIME,
        });
    }
    out
}

/// Claim p50 at the largest backlog against the smallest, per target (not the
/// in-memory model, whose claim scans every open job by design).
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
            out.push(Verdict {
                goal: format!("{t} claim p50 at {large} pending <= 1.5x at {small}"),
                figure: format!("{:.2}x", b / a),
                met: b / a <= 1.5,
            });
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
        println!("  {:<58} {:>10}  {status}", v.goal, v.figure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scenario: &str, target: &str, value: f64) -> Row {
        let unit = if scenario.contains("p50") {
            "ms"
        } else {
            "jobs/s"
        };
        Row {
            scenario: scenario.to_owned(),
            target: target.to_owned(),
            value,
            unit,
            note: String::new(),
        }
    }

    fn verdict<'a>(vs: &'a [Verdict], goal: &str) -> &'a Verdict {
        vs.iter()
            .find(|v| v.goal == goal)
            .unwrap_or_else(|| panic!("no verdict {goal:?} in {vs:?}"))
    }

    #[test]
    fn drain_goals_compare_with_the_raw_loop_and_each_peers_fastest_row() {
        let rows = vec![
            row("drain, concurrency 16, prefetch 256", "postgres", 60_000.0),
            row("raw drain, 16 loops of 50", "postgres", 100_000.0),
            row("drain, concurrency 1", "graphile-worker", 41_000.0),
            row("drain, concurrency 16", "graphile-worker", 39_000.0),
            row("drain, concurrency 16", "apalis-postgres", 6_100.0),
            row("drain, concurrency 16, prefetch 256", "redis", 119_000.0),
            row("raw drain, 16 loops of 50", "redis", 300_000.0),
        ];
        let vs = judge(&rows, Duration::from_secs(400), false);
        let raw = verdict(&vs, "postgres drain >= 60% of its raw loop");
        assert_eq!((raw.figure.as_str(), raw.met), ("60.0%", true));
        assert!(
            verdict(
                &vs,
                "postgres drain >= 1.5x graphile-worker at concurrency 16"
            )
            .met
        );
        let fastest = verdict(
            &vs,
            "postgres drain >= 1.5x graphile-worker at its fastest (1)",
        );
        assert_eq!((fastest.figure.as_str(), fastest.met), ("1.46x", false));
        assert!(
            !verdict(
                &vs,
                "postgres drain >= 10x apalis-postgres at concurrency 16"
            )
            .met
        );
        let redis = verdict(&vs, "redis drain >= 40% of its raw loop");
        assert_eq!((redis.figure.as_str(), redis.met), ("39.7%", false));
        // Nothing measured, nothing judged: no apalis-redis rows, no run time.
        assert!(vs.iter().all(|v| !v.goal.contains("apalis-redis")));
        assert!(vs.iter().all(|v| !v.goal.starts_with("--all")));
    }

    #[test]
    fn latency_stage_and_backlog_goals_use_their_bounds() {
        let rows = vec![
            row("latency 500/s, enqueue->start p50", "postgres", 5.2),
            row("latency 500/s, enqueue->start p50", "redis", 0.3),
            row("stages 20x50, transition p50", "sqlite", 9.9),
            row("claim 5 with 1000 pending, p50", "postgres", 0.2),
            row("claim 5 with 1000 pending, p99", "postgres", 9.0),
            row("claim 5 with 1000 pending, p50", "redis", 0.1),
            row("claim 5 with 1000000 pending, p50", "postgres", 0.31),
            row("claim 5 with 1000000 pending, p50", "redis", 0.12),
            row("claim 5 with 1000 pending, p50", "memory", 0.1),
            row("claim 5 with 10000 pending, p50", "memory", 1.0),
        ];
        let vs = judge(&rows, Duration::from_secs(601), true);
        assert!(!verdict(&vs, "postgres enqueue-to-start p50 <= 5 ms").met);
        assert!(verdict(&vs, "redis enqueue-to-start p50 <= 5 ms").met);
        assert!(verdict(&vs, "sqlite stage transition p50 <= 10 ms").met);
        let backlog = verdict(&vs, "postgres claim p50 at 1000000 pending <= 1.5x at 1000");
        assert_eq!((backlog.figure.as_str(), backlog.met), ("1.55x", false));
        assert!(verdict(&vs, "redis claim p50 at 1000000 pending <= 1.5x at 1000").met);
        // One verdict per target, though its sizes came apart in the rows.
        assert_eq!(
            vs.iter().filter(|v| v.goal.contains("claim p50")).count(),
            2
        );
        assert!(vs.iter().all(|v| !v.goal.starts_with("memory")));
        assert!(!verdict(&vs, "--all measured within ~10 minutes").met);
    }
}
