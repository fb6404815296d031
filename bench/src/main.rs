//! relayq's benchmark: every backend side by side with the raw limit of its server, in
//! one run, runs interleaved (A B A B) and medians reported.
//!
//! ```sh
//! cargo run --release --manifest-path bench/Cargo.toml -- --all
//! cargo run --release --manifest-path bench/Cargo.toml -- --quick
//! ```
//!
//! Scenarios: 1 enqueue (one at a time from 8 tasks, and batches of 1,000), 2 drain
//! (pre-enqueued no-op jobs, worker concurrency 1/4/16/64), 3 enqueue-to-start latency
//! at 500 jobs/s, 4 stages (20 x 50 in one batch; and one stage of 20,000 drained), 5
//! groups (100 x 100), 6 claim latency with 1k/100k/1M pending; the raw loops
//! (PostgreSQL: claim 50 with the `SKIP LOCKED` CTE, then one batched `DELETE`; Redis:
//! pop 50 with `ZPOPMIN` in one script, acknowledge the 50 in another); and the peers
//! (apalis, graphile_worker, built from `bench/peers`) on every scenario they can run. Each row is printed as
//! measured and appended as JSON to the results file; the ratios come last, then the
//! issue's goals judged on the run's own rows (not after `--quick`).

mod after;
mod backlog;
mod burst;
mod cancel;
mod dashboard;
mod goals;
mod groups;
mod keys;
mod latency;
mod paired;
mod peers;
mod phases;
mod phases_raw;
mod progress;
mod rates;
mod raw;
mod scenarios;
mod schedules;
mod stages;
mod targets;
mod timed;

use std::{io::Write, path::PathBuf};

use clap::Parser;

use crate::targets::Target;

#[derive(Parser)]
#[command(about = "relayq's backends side by side with their servers' raw limits")]
struct Args {
    /// Every scenario on every available target (servers from RELAYQ_POSTGRES_URL,
    /// RELAYQ_REDIS_URL, RELAYQ_REDIS_CLUSTER_URLS).
    #[arg(long)]
    all: bool,
    /// Smaller job counts, for a quick look.
    #[arg(long)]
    quick: bool,
    /// The issue's job counts in every row: 50,000 one-at-a-time enqueues and 50,000
    /// jobs in every drain of the sweep, where `--all` gives those rows a tenth
    /// ([`SHARE`]) to measure everything within about ten minutes. So a peer's fastest
    /// row drains as many jobs as ours. Takes about three times as long (963 s measuring
    /// against 276-402 s on the machine of docs/BENCHMARKS.md); the run-time goal is not
    /// judged.
    #[arg(long, conflicts_with = "quick")]
    full_counts: bool,
    /// Runs per measurement (interleaved across targets); the median is reported.
    #[arg(long, default_value_t = RUNS)]
    runs: usize,
    /// Run only these scenarios (comma-separated: enqueue, drain, drain16 (the
    /// concurrency-16 rows alone), prefetch (the prefetch row alone, for profiling it),
    /// raw, latency, stages, after, groups, keys, rates, backlog, burst, cancel, progress, schedules; and
    /// phases, which only runs when named here).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Measure only these of our targets (comma-separated: memory, sqlite, postgres,
    /// redis, redis-cluster, mssql); default every available one.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// The worker prefetch of the drain rows that use one. Default 100: the fetch-ahead
    /// the peers run with (graphile_worker's local queue, apalis's batch). 0..=1000, as
    /// the worker takes it: checked here, because a worker refusing it would fail only
    /// after its queue was filled, leaving those jobs behind for later runs.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1000))]
    prefetch: u32,
    /// Seconds per phase of the `phases` scenario.
    #[arg(long, default_value_t = 30)]
    phase_seconds: u64,
    /// The producer rates of the `phases` scenario, jobs/s (comma-separated); default
    /// 500, 2000 and 5000 (500 with `--quick`).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=100_000))]
    phase_rates: Vec<u64>,
    /// Leave the peers (apalis, graphile_worker) out.
    #[arg(long)]
    no_peers: bool,
    /// Where rows are appended as JSON lines (default: `results.jsonl` beside the
    /// bench's `Cargo.toml`, wherever it is run from).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results.jsonl"))]
    results: PathBuf,
}

impl Args {
    /// The share of the headline rows' jobs that the one-at-a-time enqueues and the
    /// sweep's other drains get.
    fn share(&self) -> usize {
        if self.full_counts { 1 } else { SHARE }
    }

    /// What kind of run these arguments make, for judging the goals; `measured` is how
    /// long it measured.
    fn run(&self, measured: std::time::Duration) -> goals::Run {
        let everything =
            !self.no_peers && self.runs == RUNS && self.only.is_empty() && self.targets.is_empty();
        goals::Run {
            full: everything,
            timed: (everything && !self.full_counts).then_some(measured),
            share: self.share(),
        }
    }
}

/// Runs per measurement unless `--runs` says otherwise.
const RUNS: usize = 3;

/// One measured figure.
pub struct Row {
    pub scenario: String,
    pub target: String,
    pub value: f64,
    pub unit: &'static str,
    /// For a peer: every setting it ran with.
    pub note: String,
}

/// Unless `--full-counts`, the one-at-a-time enqueues and the drains at concurrency 1, 4
/// and 64 get this fraction of the headline rows' jobs (see `main`). A peer's fastest
/// row may be one of those drains, and its rate may depend on the count
/// (apalis-postgres's falls as its worker's finished jobs pile up: each ack reads them
/// all), so the goals say so.
pub const SHARE: usize = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.all || args.quick, "say --all or --quick");
    let quick = args.quick;
    let n = if quick { 5_000 } else { 50_000 };
    let share = args.share();
    let mut targets = targets::available().await?;
    if !args.targets.is_empty() {
        targets.retain(|t| args.targets.iter().any(|n| n == t.label()));
    }
    let peers = peers::Peers::build(args.no_peers);
    let runs = args.runs;
    let mut rows = Vec::new();
    print_header();
    let started = std::time::Instant::now();
    let mut last = started;
    let mut add = |found: Vec<Row>| {
        print(&found);
        say(&format!("measured in {:.0?}", last.elapsed()));
        last = std::time::Instant::now();
        rows.extend(found);
    };
    // The headline drain (concurrency 16) gets all 50,000 jobs; one-at-a-time
    // enqueues and the rest of the sweep get a tenth unless `--full-counts`: at their
    // rates (some peers enqueue below 2,000 jobs/s, and concurrency 1 without prefetch
    // drains 2,000-4,000 jobs/s) full counts took 16 minutes where `--all` has ten.
    let on = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    if on("enqueue") {
        add(scenarios::enqueue(&targets, &peers, n, share, runs).await?);
    }
    let mut raw_done = false;
    for concurrency in [1, 4, 16, 64] {
        // `drain16` runs just the headline rows, `prefetch` the prefetch row alone.
        let alone = concurrency == 16 && on("prefetch");
        if !(on("drain") || concurrency == 16 && on("drain16") || alone) {
            continue;
        }
        let jobs = if concurrency == 16 { n } else { n / share };
        if !alone || on("drain") || on("drain16") {
            // The worker as a user gets it (automatic prefetch), beside the peers; then
            // claiming only for free slots (`prefetch(0)`), its floor.
            add(scenarios::drain(&targets, &peers, jobs, concurrency, None, runs).await?);
            add(scenarios::drain(&targets, &peers, jobs, concurrency, Some(0), runs).await?);
        }
        if concurrency == 16 {
            // The same drain with the worker's opt-in prefetch, the counterpart of the
            // peers' fetch-ahead settings; with the raw loops, round by round.
            if on("raw") {
                add(paired::drain_and_raw(&targets, &peers, jobs, args.prefetch, runs).await?);
                raw_done = true;
            } else {
                let prefetch = Some(args.prefetch);
                add(scenarios::drain(&targets, &peers, jobs, 16, prefetch, runs).await?);
            }
        }
    }
    if on("raw") && !raw_done {
        add(raw::loops(&targets, n, runs).await?);
    }
    if on("latency") {
        add(latency::latency(&targets, &peers, if quick { 500 } else { 1_000 }, runs).await?);
    }
    if on("stages") {
        add(stages::stages(&targets, runs).await?);
        let jobs = if quick { 5_000 } else { 20_000 };
        add(stages::big_stage(&targets, jobs, args.prefetch, runs).await?);
    }
    if on("after") {
        add(after::after(&targets, runs, quick).await?);
    }
    if on("keys") {
        let (jobs, keys) = if quick {
            (5_000, 1_000)
        } else {
            (50_000, 10_000)
        };
        add(keys::keys(&targets, jobs, keys, args.prefetch, runs).await?);
        add(keys::starvation(&targets, args.prefetch, runs).await?);
    }
    if on("rates") {
        let (jobs, paced) = if quick {
            (5_000, 2_000)
        } else {
            (50_000, 6_000)
        };
        add(rates::rates(&targets, jobs, paced, args.prefetch, runs).await?);
        add(rates::key_rates(&targets, jobs, paced, args.prefetch, runs).await?);
    }
    if on("groups") {
        let per_group = if quick { 10 } else { 100 };
        add(groups::groups(&targets, &peers, per_group, 0, runs).await?);
        // The worker's opt-in prefetch, as in the drain rows.
        add(groups::groups(&targets, &peers, per_group, args.prefetch, runs).await?);
    }
    let sizes: &[usize] = if quick {
        &[1_000, 10_000, 100_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    if on("backlog") {
        // Printed as measured inside (each size takes a while to build).
        rows.extend(backlog::backlog(&targets, sizes).await?);
    }
    if args.only.iter().any(|o| o == "phases") {
        // Not part of `--all`: three rates of three phases take minutes each.
        let phase = std::time::Duration::from_secs(if quick { 5 } else { args.phase_seconds });
        let rates: &[u64] = match (&args.phase_rates[..], quick) {
            ([], true) => &[500],
            ([], false) => &[500, 2_000, 5_000],
            (chosen, _) => chosen,
        };
        rows.extend(phases::phases(&targets, &peers, rates, phase).await?);
    }
    if on("burst") {
        // Printed as measured inside.
        rows.extend(burst::burst(&targets, if quick { 5_000 } else { 50_000 }).await?);
    }
    if on("cancel") {
        // Printed as measured inside.
        rows.extend(cancel::cancel(&targets, if quick { 50 } else { 500 }).await?);
    }
    if on("progress") {
        // Printed as measured inside.
        rows.extend(progress::progress(&targets, if quick { 250 } else { 1_000 }).await?);
    }
    if on("schedules") {
        // Printed as measured inside.
        let (n, window) = if quick { (200, 6) } else { (1_000, 21) };
        rows.extend(
            schedules::schedules(&targets, n, std::time::Duration::from_secs(window)).await?,
        );
        let idle = std::time::Duration::from_secs(if quick { 3 } else { 20 });
        rows.extend(schedules::idle(&targets, n, idle).await?);
    }
    let measured = started.elapsed();
    say(&format!("all measured in {measured:.0?}"));
    print_ratios(&rows);
    // The goals are about the full counts: a quick run's figures judge nothing. The
    // run time is a goal only for a run of everything, as `--all` runs it.
    if !quick {
        goals::print(&goals::judge(&rows, &args.run(measured)));
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.results)
        .map_err(|e| anyhow::anyhow!("cannot append to {}: {e}", args.results.display()))?;
    let at = chrono::Utc::now().to_rfc3339();
    for r in &rows {
        let line = serde_json::json!({
            "at": at, "scenario": r.scenario, "target": r.target, "value": r.value,
            "unit": r.unit, "runs": runs, "jobs": n, "full_counts": args.full_counts,
            "settings": r.note,
        });
        writeln!(file, "{line}")?;
    }
    Ok(())
}

/// Ratios of ours to each peer and to the raw limit, for every scenario both ran:
/// relayq on a server against the peer or raw loop on the same server.
#[allow(clippy::print_stdout)]
fn print_ratios(rows: &[Row]) {
    const SAME_SERVER: &[(&str, &[&str])] = &[
        (
            "postgres",
            &["apalis-postgres", "graphile-worker", "raw:postgres"],
        ),
        ("redis", &["apalis-redis", "raw:redis"]),
        ("sqlite", &["apalis-sqlite"]),
    ];
    println!("\nratios (ours / other; for ms rows, other / ours, so above 1 is better)");
    let find = |scenario: &str, target: &str| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.target == target)
    };
    for r in rows {
        let Some((_, others)) = SAME_SERVER.iter().find(|(t, _)| *t == r.target) else {
            continue;
        };
        // Only rates and times compare as ours / theirs; the phases' backlogs, dead
        // rows and sizes do not (a larger one is worse, and either may be 0).
        if !matches!(r.unit, "jobs/s" | "ms") {
            continue;
        }
        for other in *others {
            let theirs = match other.strip_prefix("raw:") {
                Some(server) if r.scenario.starts_with("drain, concurrency 16") => rows
                    .iter()
                    .find(|x| x.scenario.starts_with("raw drain") && x.target == server),
                Some(_) => None,
                // Peers run the prefetch rows' drain without the suffix.
                None => find(
                    r.scenario.split(", prefetch").next().unwrap_or_default(),
                    other,
                ),
            };
            if let Some(t) = theirs {
                let ratio = if r.unit == "ms" {
                    t.value / r.value
                } else {
                    r.value / t.value
                };
                println!(
                    "{:<44} {:<9} / {:<16} {:>6.2}",
                    r.scenario, r.target, other, ratio
                );
            }
        }
    }
    // Each setting string once per target: a peer's phases run gives 22 rows one note.
    let mut shown = std::collections::HashSet::new();
    for r in rows.iter().filter(|r| !r.note.is_empty()) {
        if find(&r.scenario, &r.target).is_some_and(|f| std::ptr::eq(f, r))
            && shown.insert((&r.target, &r.note))
        {
            println!("settings {} ({}): {}", r.target, r.scenario, r.note);
        }
    }
}

#[allow(clippy::print_stdout)]
fn print_header() {
    println!("{:<44} {:<16} {:>12}", "scenario", "target", "median");
}

/// Prints rows as soon as they are measured.
#[allow(clippy::print_stdout)]
pub(crate) fn print(rows: &[Row]) {
    for r in rows {
        let digits = if matches!(r.unit, "ms" | "x") { 2 } else { 0 };
        println!(
            "{:<44} {:<16} {:>10.digits$} {}",
            r.scenario, r.target, r.value, r.unit
        );
    }
}

/// A line of commentary among the rows.
#[allow(clippy::print_stdout)]
pub(crate) fn say(line: &str) {
    println!("  ({line})");
}

/// The median of `xs` (not empty).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

impl Target {
    fn label(&self) -> &'static str {
        match self {
            Target::Memory => "memory",
            Target::Sqlite(_) => "sqlite",
            Target::Postgres(_) => "postgres",
            Target::Redis(_) => "redis",
            Target::RedisCluster(_) => "redis-cluster",
            Target::Mssql(_) => "mssql",
            Target::Other(driver, _) => driver.name,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{Args, SHARE};

    /// A prefetch the worker would refuse is refused before any queue is filled.
    #[test]
    fn prefetch_is_checked_before_anything_runs() {
        assert!(Args::try_parse_from(["bench", "--quick", "--prefetch", "1000"]).is_ok());
        let err = Args::try_parse_from(["bench", "--quick", "--prefetch", "1001"])
            .err()
            .expect("1001 is refused");
        assert!(err.to_string().contains("--prefetch"), "{err}");
    }

    /// `--all` gives the single enqueues and the sweep a tenth of the jobs and judges its
    /// run time; `--full-counts` gives them all the jobs (a share of one, which `main`
    /// and `scenarios::enqueue` divide by) and, being longer on purpose, judges no run
    /// time; a partial run judges none either.
    #[test]
    fn full_counts_set_a_share_of_one_and_judge_no_run_time() {
        let run = |args: &[&str]| {
            let args = Args::try_parse_from(args).expect("valid arguments");
            (args.share(), args.run(Duration::from_secs(700)))
        };
        let (share, all) = run(&["bench", "--all"]);
        assert_eq!((share, all.share, all.full), (SHARE, SHARE, true));
        assert_eq!(all.timed, Some(Duration::from_secs(700)));
        let (share, full) = run(&["bench", "--all", "--full-counts"]);
        assert_eq!(
            (share, full.share, full.full, full.timed),
            (1, 1, true, None)
        );
        let (_, part) = run(&["bench", "--all", "--only", "drain"]);
        assert_eq!((part.full, part.timed), (false, None));
        assert!(Args::try_parse_from(["bench", "--quick", "--full-counts"]).is_err());
    }
}
