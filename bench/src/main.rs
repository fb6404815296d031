//! relayq's benchmark: every backend side by side with the raw limit of its server, in
//! one run, runs interleaved (A B A B) and medians reported.
//!
//! ```sh
//! cargo run --release --manifest-path bench/Cargo.toml -- --all
//! cargo run --release --manifest-path bench/Cargo.toml -- --quick
//! ```
//!
//! Scenarios so far: enqueue (one at a time from 8 tasks, and batches of 1,000) and
//! drain (pre-enqueued no-op jobs, worker concurrency 1/4/16/64), plus the raw loops
//! (PostgreSQL: claim 50 with the `SKIP LOCKED` CTE, then one batched `DELETE`; Redis:
//! pop 50 with `ZPOPMIN` in one script, acknowledge the 50 in another). Each row is
//! printed and appended as JSON to the results file.

mod raw;
mod scenarios;
mod targets;

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
    /// Runs per measurement (interleaved across targets); the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where rows are appended as JSON lines.
    #[arg(long, default_value = "bench/results.jsonl")]
    results: PathBuf,
}

/// One measured figure.
pub struct Row {
    pub scenario: String,
    pub target: String,
    pub value: f64,
    pub unit: &'static str,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let n = if args.quick { 5_000 } else { 50_000 };
    let targets = targets::available().await?;
    let mut rows = Vec::new();
    print_header();
    if args.all || args.quick {
        let found = scenarios::enqueue(&targets, n, args.runs).await?;
        print(&found);
        rows.extend(found);
        for concurrency in [1, 4, 16, 64] {
            let jobs = if concurrency == 1 { n / 5 } else { n };
            let found = scenarios::drain(&targets, jobs, concurrency, args.runs).await?;
            print(&found);
            rows.extend(found);
        }
        let found = raw::loops(&targets, n, args.runs).await?;
        print(&found);
        rows.extend(found);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.results)?;
    let at = chrono::Utc::now().to_rfc3339();
    for r in &rows {
        let line = serde_json::json!({
            "at": at, "scenario": r.scenario, "target": r.target,
            "value": r.value, "unit": r.unit, "runs": args.runs, "jobs": n,
        });
        writeln!(file, "{line}")?;
    }
    Ok(())
}

#[allow(clippy::print_stdout)]
fn print_header() {
    println!("{:<34} {:<16} {:>12}", "scenario", "target", "median");
}

/// Prints rows as soon as they are measured.
#[allow(clippy::print_stdout)]
fn print(rows: &[Row]) {
    for r in rows {
        println!(
            "{:<34} {:<16} {:>10.0} {}",
            r.scenario, r.target, r.value, r.unit
        );
    }
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
        }
    }
}
