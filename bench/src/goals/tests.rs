use std::time::Duration;

use super::{Run, Verdict, judge};
use crate::{Row, SHARE};

/// A run of some scenarios, at `--all`'s counts.
fn part() -> Run {
    Run {
        full: false,
        timed: None,
        share: SHARE,
    }
}

/// `--all` as it is, which measured for `took`.
fn all(took: Duration) -> Run {
    Run {
        full: true,
        timed: Some(took),
        share: SHARE,
    }
}

fn row(scenario: &str, target: &str, value: f64) -> Row {
    let unit = if scenario.contains("p50") || scenario.contains("p99") {
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

fn judged<'a>(vs: &'a [Verdict], goal: &str) -> (&'a str, bool) {
    let v = verdict(vs, goal);
    (v.figure.as_str(), v.met)
}

#[test]
fn drain_goals_take_the_prefetch_row_against_the_raw_loop_and_the_peers() {
    let rows = vec![
        // Rows a looser match would take for ours: both come first.
        row("drain, concurrency 16", "postgres", 99_000.0),
        row(
            "drain, one batch stage, concurrency 16, prefetch 256",
            "postgres",
            98_000.0,
        ),
        row("drain, concurrency 16, prefetch 256", "postgres", 60_000.0),
        row("raw drain, 16 loops of 50", "postgres", 100_000.0),
        row("drain, concurrency 1", "graphile-worker", 41_000.0),
        row("drain, concurrency 4", "graphile-worker", 30_000.0),
        row("drain, concurrency 16", "graphile-worker", 39_000.0),
        row("drain, concurrency 64", "graphile-worker", 35_000.0),
        row("drain, concurrency 16", "apalis-postgres", 6_000.0),
        row("drain, concurrency 64", "apalis-postgres", 16_000.0),
        row("drain, concurrency 16, prefetch 256", "redis", 119_000.0),
        row("raw drain, 16 loops of 50", "redis", 300_000.0),
    ];
    let vs = judge(&rows, &part());
    // Exactly at the bound is met.
    let raw = judged(&vs, "postgres drain >= 60% of its raw loop");
    assert_eq!(raw, ("60.00%", true));
    let c16 = judged(
        &vs,
        "postgres drain >= 1.5x graphile-worker at concurrency 16",
    );
    assert_eq!(c16, ("1.538x", true));
    let fastest = judged(
        &vs,
        "postgres drain >= 1.5x graphile-worker at its fastest (1, on 1/10 of the jobs)",
    );
    assert_eq!(fastest, ("1.463x", false));
    let apalis = judged(
        &vs,
        "postgres drain >= 10x apalis-postgres at concurrency 16",
    );
    assert_eq!(apalis, ("10.000x", true));
    // apalis-postgres ran two of the four concurrencies: no "fastest" from a part.
    assert!(
        vs.iter()
            .all(|v| !v.goal.contains("apalis-postgres at its fastest"))
    );
    let redis = judged(&vs, "redis drain >= 40% of its raw loop");
    assert_eq!(redis, ("39.67%", false));
    // Not a run of everything: what was not measured is left out, run time included.
    assert!(vs.iter().all(|v| !v.goal.contains("apalis-redis")));
    assert!(vs.iter().all(|v| !v.goal.starts_with("--all")));
}

#[test]
fn the_default_worker_is_judged_against_each_peer_at_its_own_concurrency() {
    let rows = vec![
        // The floor's row comes first and is not the prefetch row.
        row("drain, concurrency 16, prefetch 0", "postgres", 1_000.0),
        row("drain, concurrency 16, prefetch 256", "postgres", 60_000.0),
        row("drain, concurrency 1", "postgres", 9_000.0),
        row("drain, concurrency 1, prefetch 0", "postgres", 99_000.0),
        row("drain, concurrency 4", "postgres", 12_000.0),
        row("drain, concurrency 1", "graphile-worker", 10_000.0),
        row("drain, concurrency 4", "graphile-worker", 12_000.0),
        row("drain, concurrency 16", "graphile-worker", 40_000.0),
        row("drain, concurrency 4", "apalis-postgres", 3_000.0),
    ];
    let vs = judge(&rows, &part());
    let c16 = judged(
        &vs,
        "postgres drain >= 1.5x graphile-worker at concurrency 16",
    );
    assert_eq!(c16, ("1.500x", true));
    let c1 = judged(
        &vs,
        "postgres default worker >= 1x graphile-worker at concurrency 1, on 1/10 of the jobs",
    );
    assert_eq!(c1, ("0.900x", false));
    let c4 = judged(
        &vs,
        "postgres default worker >= 1x graphile-worker at concurrency 4, on 1/10 of the jobs",
    );
    assert_eq!(c4, ("1.000x", true));
    let apalis = judged(
        &vs,
        "postgres default worker >= 3x apalis-postgres at concurrency 4, on 1/10 of the jobs",
    );
    assert_eq!(apalis, ("4.000x", true));
    // Our concurrency 16 without its default row: left out of a part.
    assert!(
        vs.iter()
            .all(|v| !v.goal.contains("at concurrency 16") || !v.goal.contains("default"))
    );
    // A run of everything says what it did not measure.
    let vs = judge(&rows, &all(Duration::from_secs(1)));
    let c64 = judged(
        &vs,
        "postgres default worker >= 1x graphile-worker at concurrency 64, on 1/10 of the jobs",
    );
    assert_eq!(c64, ("not measured", false));
}

#[test]
fn a_peers_fastest_row_is_labelled_with_its_share_of_the_jobs() {
    let sweep = |c16: f64| {
        vec![
            row("drain, concurrency 16, prefetch 256", "redis", 90_000.0),
            row("drain, concurrency 1", "apalis-redis", 40_000.0),
            row("drain, concurrency 4", "apalis-redis", 41_000.0),
            row("drain, concurrency 16", "apalis-redis", c16),
            row("drain, concurrency 64", "apalis-redis", 30_000.0),
        ]
    };
    // Fastest at concurrency 4, which drained a tenth of the jobs: the label says so.
    let vs = judge(&sweep(39_000.0), &part());
    let fastest = judged(
        &vs,
        "redis drain >= 1.5x apalis-redis at its fastest (4, on 1/10 of the jobs)",
    );
    assert_eq!(fastest, ("2.195x", true));
    // Fastest at concurrency 16, which drained as many jobs as ours: no label.
    let vs = judge(&sweep(45_000.0), &part());
    let fastest = judged(&vs, "redis drain >= 1.5x apalis-redis at its fastest (16)");
    assert_eq!(fastest, ("2.000x", true));
    // With `--full-counts` every row of the sweep drained as many: no label either.
    let full_counts = Run { share: 1, ..part() };
    let vs = judge(&sweep(39_000.0), &full_counts);
    let fastest = judged(&vs, "redis drain >= 1.5x apalis-redis at its fastest (4)");
    assert_eq!(fastest, ("2.195x", true));
}

#[test]
fn a_full_run_says_which_drain_goals_it_could_not_judge() {
    let rows = vec![
        row("drain, concurrency 16, prefetch 256", "postgres", 60_000.0),
        row("raw drain, 16 loops of 50", "postgres", 90_000.0),
    ];
    let vs = judge(&rows, &all(Duration::from_secs(600)));
    assert_eq!(
        judged(&vs, "postgres drain >= 60% of its raw loop"),
        ("66.67%", true)
    );
    for goal in [
        "postgres drain >= 1.5x graphile-worker at concurrency 16",
        "redis drain >= 40% of its raw loop",
        "redis drain >= 1.5x apalis-redis at concurrency 16",
    ] {
        assert_eq!(judged(&vs, goal), ("not measured", false));
    }
    assert_eq!(
        judged(&vs, "--all measured within ~10 minutes"),
        ("600 s", true)
    );
    let late = judge(&rows, &all(Duration::from_millis(600_001)));
    assert!(!verdict(&late, "--all measured within ~10 minutes").met);
}

#[test]
fn latency_transition_and_backlog_goals_are_met_at_their_bounds() {
    let rows = vec![
        row("latency 500/s, enqueue->start p50", "postgres", 5.0),
        row("latency 500/s, enqueue->start p50", "redis", 5.01),
        row("stages 20x50, transition p50", "sqlite", 10.0),
        row("stages 20x50, transition p50", "postgres", 10.5),
        row("stages 20x50, transition p50", "memory", 20.0),
        row("claim 5 with 1000 pending, p50", "postgres", 0.25),
        row("claim 5 with 1000 pending, p50", "redis", 0.1),
        row("claim 5 with 1000000 pending, p50", "postgres", 0.375),
        // A p99 row at the largest size must not stand in for its p50.
        row("claim 5 with 1000000 pending, p99", "postgres", 9.0),
        row("claim 5 with 1000000 pending, p50", "redis", 0.155),
        row("claim 5 with 1000 pending, p50", "memory", 0.1),
        row("claim 5 with 10000 pending, p50", "memory", 1.0),
    ];
    let vs = judge(&rows, &part());
    assert!(verdict(&vs, "postgres enqueue-to-start p50 <= 5 ms").met);
    assert!(!verdict(&vs, "redis enqueue-to-start p50 <= 5 ms").met);
    assert!(verdict(&vs, "sqlite stage transition p50 <= 10 ms").met);
    assert!(!verdict(&vs, "postgres stage transition p50 <= 10 ms").met);
    let pg = judged(&vs, "postgres claim p50 at 1000000 pending <= 1.5x at 1000");
    assert_eq!(pg, ("1.500x", true));
    let redis = judged(&vs, "redis claim p50 at 1000000 pending <= 1.5x at 1000");
    assert_eq!(redis, ("1.550x", false));
    // One verdict per target, though its sizes came apart in the rows; none for the
    // in-memory model.
    assert_eq!(
        vs.iter().filter(|v| v.goal.contains("claim p50")).count(),
        2
    );
    assert!(vs.iter().all(|v| !v.goal.starts_with("memory")));
}

#[test]
fn a_burst_is_judged_against_the_first_drain_of_its_backend() {
    let rows = [
        row(
            "drain-analyze-burst 50000: first drain, claim p50",
            "postgres",
            4.0,
        ),
        row(
            "drain-analyze-burst 50000: burst after analyze, claim p50",
            "postgres",
            5.9,
        ),
        row(
            "drain-analyze-burst 50000: first drain, claim p50",
            "sqlite",
            4.0,
        ),
        row(
            "drain-analyze-burst 50000: burst after analyze, claim p50",
            "sqlite",
            6.1,
        ),
    ];
    let vs = judge(&rows, &part());
    let goal = "burst claim p50 after analyze <= 1.5x first drain's";
    assert!(verdict(&vs, &format!("postgres {goal}")).met);
    assert!(!verdict(&vs, &format!("sqlite {goal}")).met);
}

#[test]
fn the_phases_are_judged_per_rate_on_postgres() {
    let rows = [
        row("phases 2000/s, clean: done/s mean", "postgres", 1_990.0),
        row(
            "phases 2000/s, idle-in-tx: done/s mean",
            "postgres",
            1_900.0,
        ),
        row("phases 2000/s, idle-in-tx: claim p99", "postgres", 140.0),
        row("phases 2000/s, rr-readers: pickup p99", "postgres", 100.0),
        row("phases 2000/s, rr-readers: pickup p50", "postgres", 300.0),
        row(
            "phases 2000/s, recovery: backlog gone after",
            "postgres",
            6.0,
        ),
        row(
            "phases 2000/s, rr-recovery: backlog gone after",
            "postgres",
            5.0,
        ),
        row("phases 2000/s, clean: done/s mean", "sqlite", 10.0),
    ];
    let vs = judge(&rows, &part());
    let goal = |g: &str| format!("postgres phases 2000/s, {g}");
    assert!(verdict(&vs, &goal("clean: done/s >= 98% of the rate")).met);
    assert!(!verdict(&vs, &goal("idle-in-tx: done/s >= 98% of the rate")).met);
    assert!(!verdict(&vs, &goal("idle-in-tx: claim p99 <= 100 ms")).met);
    // Exactly at the bound is met; a p50 is not judged.
    assert!(verdict(&vs, &goal("rr-readers: pickup p99 <= 100 ms")).met);
    assert!(!vs.iter().any(|v| v.goal.contains("pickup p50")));
    assert!(!verdict(&vs, &goal("recovery: backlog gone within 5 s")).met);
    assert!(verdict(&vs, &goal("rr-recovery: backlog gone within 5 s")).met);
    assert!(
        !vs.iter().any(|v| v.goal.contains("sqlite")),
        "SQLite is a check, not judged"
    );
}
