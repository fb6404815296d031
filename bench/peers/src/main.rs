//! relayq's benchmark workloads on peer job queues: apalis 1.0 (PostgreSQL, Redis,
//! SQLite) and graphile_worker 0.14, each used through its public API only and set up
//! as its documentation recommends for throughput.
//!
//! One invocation is one measurement and prints one JSON line on stdout; the caller
//! interleaves runs and takes medians. A scenario a peer cannot run exits with code 2.
//!
//! ```sh
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- \
//!     --peer graphile-worker --scenario drain --jobs 50000 --concurrency 16
//! ```
//!
//! A workspace of its own, so that the peers' dependency trees never enter relayq's.

mod apalis_pg;
mod apalis_redis;
mod apalis_shared;
mod apalis_sqlite;
mod common;
mod graphile;
mod graphile_phases;

use std::{fmt, process::ExitCode};

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Peer {
    ApalisPostgres,
    ApalisRedis,
    ApalisSqlite,
    GraphileWorker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// `jobs` single pushes from 8 tasks.
    EnqueueSingle,
    /// `jobs` pushed 1,000 at a time with the peer's bulk API.
    EnqueueBatch,
    /// `jobs` pre-enqueued, then drained by a worker of `concurrency` (no-op handler).
    Drain,
    /// `jobs` enqueued at 500/s onto idle workers; start latency percentiles.
    Latency,
    /// 100 serial queues of `jobs / 100` each, concurrency 16 (graphile_worker only).
    Groups,
    /// A producer at `rate` through three phases of `phase_secs`, the second with a
    /// transaction held open (relayq's bench/src/phases.rs; graphile_worker only).
    /// `jobs` is not used.
    Phases,
}

#[derive(Parser)]
#[command(about = "relayq's benchmark workloads on peer job queues; prints one JSON line")]
pub struct Args {
    #[arg(long, value_enum)]
    peer: Peer,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    #[arg(long)]
    pub jobs: usize,
    /// Worker concurrency (drain; latency and groups use 16 unless told otherwise).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The phases scenario's producer rate, jobs/s.
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// The length of each of the phases scenario's three phases, seconds.
    #[arg(long, default_value_t = 30)]
    pub phase_secs: u64,
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_url: String,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

/// A scenario the peer has no way to run; the caller skips it.
#[derive(Debug)]
pub struct Unsupported(pub &'static str);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unsupported: {}", self.0)
    }
}

impl std::error::Error for Unsupported {}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.jobs == 0 || args.concurrency == 0 || args.rate == 0 || args.phase_secs == 0 {
        eprintln!("error: --jobs, --concurrency, --rate and --phase-secs must be positive");
        return ExitCode::FAILURE;
    }
    let outcome = match args.peer {
        Peer::ApalisPostgres => apalis_pg::run(&args).await,
        Peer::ApalisRedis => apalis_redis::run(&args).await,
        Peer::ApalisSqlite => apalis_sqlite::run(&args).await,
        Peer::GraphileWorker => graphile::run(&args).await,
    };
    let peer = args.peer.to_possible_value().expect("named");
    let scenario = args.scenario.to_possible_value().expect("named");
    match outcome {
        // A scenario of many figures (phases) gives them as `rows`, in place of one value.
        Ok(o) if !o.rows.is_empty() => {
            let line = serde_json::json!({
                "peer": peer.get_name(), "scenario": scenario.get_name(),
                "rows": o.rows, "settings": o.settings,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Ok(o) => {
            let mut line = serde_json::json!({
                "peer": peer.get_name(), "scenario": scenario.get_name(),
                "value": o.value, "unit": o.unit, "settings": o.settings,
            });
            if let Some([p50, p99, max]) = o.latency {
                line["p50"] = p50.into();
                line["p99"] = p99.into();
                line["max"] = max.into();
            }
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) if e.is::<Unsupported>() => {
            eprintln!("{} {}: {e}", peer.get_name(), scenario.get_name());
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("{} {} failed: {e:#}", peer.get_name(), scenario.get_name());
            ExitCode::FAILURE
        }
    }
}
