//! `relayq-torture`: fault runs against the `relayq` binary (see the library's docs and
//! `docs/RELIABILITY.md`).

#![allow(
    clippy::print_stdout,
    reason = "a command-line tool: its tables go to stdout"
)]

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use relayq_torture::{
    report,
    run::{self, FaultCounts, Kind, Settings},
    servers::Fsync,
    soak::{self, SoakKind},
};

/// What `--backend` names.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
    /// Redis, once with `appendfsync always` and once with `everysec` (see
    /// --redis-fsync).
    Redis,
    RedisCluster,
    /// All four, in that order.
    All,
    /// Any other backend with a server (`mssql`), at its test variable's URL.
    Given(&'static relayq::Driver),
}

/// The four backends whose servers the runs start themselves, `all`, or the name of
/// any other backend with a server that this program has.
fn backend(name: &str) -> Result<Backend, String> {
    Ok(match name {
        "sqlite" => Backend::Sqlite,
        "postgres" => Backend::Postgres,
        "redis" => Backend::Redis,
        "redis-cluster" => Backend::RedisCluster,
        "all" => Backend::All,
        name => {
            // `given:postgres`: a backend the runs could start, at its given server.
            let name = name.strip_prefix("given:").unwrap_or(name);
            let given: Vec<&'static relayq::Driver> = relayq::drivers()
                .into_iter()
                .filter(|d| d.server.is_some())
                .collect();
            match given.iter().find(|d| d.name == name) {
                Some(d) => Backend::Given(d),
                None => {
                    let names: Vec<&str> = given.iter().map(|d| d.name).collect();
                    return Err(format!(
                        "no backend {name:?}: sqlite, postgres, redis, redis-cluster, all, or \
                         one of {} at its server's URL",
                        names.join(", ")
                    ));
                }
            }
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FsyncArg {
    Always,
    Everysec,
    Both,
}

/// Fault runs against the relayq binary: own servers, a seeded job mix, seeded faults,
/// and a check of what ran against what the database says. Exits 1 on any violation.
#[derive(Debug, Parser)]
#[command(name = "relayq-torture", version)]
struct Args {
    /// The backends (comma-separated): sqlite, postgres, redis, redis-cluster (on
    /// servers each run starts and crashes itself) or all four; or any other backend
    /// with a server, such as mssql, at the URL in its test variable
    /// (`RELAYQ_MSSQL_URL`), with worker faults only (`given:postgres` runs one of the
    /// four that way).
    #[arg(long, value_parser = backend, value_delimiter = ',', default_value = "sqlite")]
    backend: Vec<Backend>,
    /// Seed of the job mix and of the fault schedule.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Jobs per run (default 1500 with --short, else 10000).
    #[arg(long)]
    jobs: Option<usize>,
    /// CI's form: about a minute per run, a few faults of every kind.
    #[arg(long)]
    short: bool,
    /// `relayq work` processes.
    #[arg(long, default_value_t = 4)]
    processes: usize,
    /// Slots per process (default 8 with --short, else 16).
    #[arg(long)]
    concurrency: Option<u32>,
    /// Each job's lease (`relayq work --lease`); a SIGSTOP lasts this plus 1 s.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Redis's `appendfsync` for `--backend redis`.
    #[arg(long, value_enum, default_value = "both")]
    redis_fsync: FsyncArg,
    /// SIGKILLs of a worker process (default 4 with --short, else 40 per 100,000 jobs, at least 4).
    #[arg(long)]
    kills: Option<u32>,
    /// SIGSTOPs past the lease (default 2, else 20 per 100,000 jobs, at least 2).
    #[arg(long)]
    stops: Option<u32>,
    /// Clean server restarts (default 1, else 5 per 100,000 jobs, at least 1).
    #[arg(long)]
    clean_restarts: Option<u32>,
    /// Crash restarts (default 2, else 5 per 100,000 jobs, at least 2).
    #[arg(long)]
    crash_restarts: Option<u32>,
    /// Connection kills (default 3, else 50 per 100,000 jobs, at least 3).
    #[arg(long)]
    conn_kills: Option<u32>,
    /// Give up on jobs not finished this long after the workers started (they are
    /// then reported stuck). Default 90 s with --short, else 120 s + 20 ms per job.
    #[arg(long, value_parser = humantime::parse_duration)]
    deadline: Option<Duration>,
    /// The relayq binary (default: `relayq` next to this program, i.e.
    /// target/debug/relayq after `cargo build -p relayq-cli`).
    #[arg(long)]
    relayq: Option<PathBuf>,
    /// Run `relayq work` in every process slot; by default every fourth slot (3, 7,
    /// ...) runs a library worker instead (`relayq-torture-worker`, next to this
    /// program).
    #[arg(long)]
    no_library: bool,
    /// Keep the temporary folders (they are kept anyway when a check fails).
    #[arg(long)]
    keep: bool,
    /// Instead of fault runs: a soak of this many minutes (after one of warm-up) on
    /// each backend named, side by side, a library worker at --rate with
    /// pruning on, and a row of figures per minute; exits 1 when a figure of the last
    /// five minutes is over 1.2x the first five (docs/RELIABILITY.md).
    #[arg(long)]
    soak: Option<usize>,
    /// Jobs per second enqueued during a soak.
    #[arg(long, default_value_t = 200)]
    rate: u64,
}

fn scaled(given: Option<u32>, short: bool, jobs: usize, per_100k: u32, floor: u32) -> u32 {
    given.unwrap_or_else(|| {
        if short {
            floor
        } else {
            let n = u64::from(per_100k) * jobs as u64 / 100_000;
            u32::try_from(n).unwrap_or(u32::MAX).max(floor)
        }
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run_all(&args).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("relayq-torture: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_all(args: &Args) -> anyhow::Result<usize> {
    if let Some(minutes) = args.soak {
        return soak_all(args, minutes).await;
    }
    let jobs = args.jobs.unwrap_or(if args.short { 1500 } else { 10_000 });
    let relayq = match &args.relayq {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("own path")?
            .with_file_name("relayq"),
    };
    let library = if args.no_library {
        None
    } else {
        let lib = std::env::current_exe()
            .context("own path")?
            .with_file_name("relayq-torture-worker");
        anyhow::ensure!(
            lib.exists(),
            "no library worker at {}: build it (cargo build -p relayq-torture) or pass --no-library",
            lib.display()
        );
        Some(lib)
    };
    let faults = FaultCounts {
        kills: scaled(args.kills, args.short, jobs, 40, 4),
        stops: scaled(args.stops, args.short, jobs, 20, 2),
        clean_restarts: scaled(args.clean_restarts, args.short, jobs, 5, 1),
        crash_restarts: scaled(args.crash_restarts, args.short, jobs, 5, 2),
        conn_kills: scaled(args.conn_kills, args.short, jobs, 50, 3),
    };
    let deadline = args.deadline.unwrap_or(if args.short {
        Duration::from_secs(90)
    } else {
        Duration::from_secs(120) + Duration::from_millis(20 * jobs as u64)
    });
    let fsyncs = match args.redis_fsync {
        FsyncArg::Always => vec![Fsync::Always],
        FsyncArg::Everysec => vec![Fsync::Everysec],
        FsyncArg::Both => vec![Fsync::Always, Fsync::Everysec],
    };
    let mut kinds = Vec::new();
    for b in &args.backend {
        match b {
            Backend::Sqlite => kinds.push(Kind::Sqlite),
            Backend::Postgres => kinds.push(Kind::Postgres),
            Backend::Redis => kinds.extend(fsyncs.iter().map(|&f| Kind::Redis(f))),
            Backend::RedisCluster => kinds.push(Kind::Cluster),
            Backend::Given(driver) => {
                run::fresh_queue();
                kinds.push(Kind::Given(driver));
            }
            Backend::All => {
                kinds.extend([Kind::Sqlite, Kind::Postgres]);
                kinds.extend(fsyncs.iter().map(|&f| Kind::Redis(f)));
                kinds.push(Kind::Cluster);
            }
        }
    }
    let command: Vec<String> = std::env::args().collect();
    let command = command.join(" ");
    let mut violations = 0;
    let mut summary = Vec::new();
    for kind in kinds {
        let settings = Settings {
            kind,
            seed: args.seed,
            jobs,
            processes: args.processes,
            concurrency: args.concurrency.unwrap_or(if args.short { 8 } else { 16 }),
            lease: args.lease,
            faults,
            max_delay: Duration::from_secs(if args.short { 5 } else { 20 }),
            deadline,
            relayq: relayq.clone(),
            library: library.clone(),
            keep: args.keep,
        };
        let outcome = run::run(&settings)
            .await
            .with_context(|| format!("the {kind} run could not take place"))?;
        print!("{}", report::render(&outcome, &command));
        let v = outcome.report.violations();
        violations += v;
        summary.push(format!(
            "{kind}: {v} violations, {} jobs in {:.1} s",
            outcome.report.checks[0].checked,
            outcome.elapsed.as_secs_f64()
        ));
    }
    println!("\n{}", summary.join("\n"));
    Ok(violations)
}

/// The soak on every backend named, side by side; the number of figures over the goal.
async fn soak_all(args: &Args, minutes: usize) -> anyhow::Result<usize> {
    let mut kinds = Vec::new();
    for b in &args.backend {
        match b {
            Backend::Sqlite => kinds.push(SoakKind::Sqlite),
            Backend::Postgres => kinds.push(SoakKind::Postgres),
            Backend::Redis => kinds.push(SoakKind::Redis),
            Backend::RedisCluster => kinds.push(SoakKind::Cluster),
            Backend::Given(driver) => anyhow::bail!(
                "--soak starts its own servers: sqlite, postgres, redis or redis-cluster, not {}",
                driver.name
            ),
            Backend::All => kinds.extend([
                SoakKind::Sqlite,
                SoakKind::Postgres,
                SoakKind::Redis,
                SoakKind::Cluster,
            ]),
        }
    }
    let root = tempfile::Builder::new().prefix("relayq-soak").tempdir()?;
    println!(
        "soak: {minutes} min after 1 min of warm-up, {} jobs/s, 16 slots, retention {:?}, on {}",
        args.rate,
        soak::RETENTION,
        kinds
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "backend | minute | done | backlog | claim p99 ms | storage MB | dead rows | worker MB"
    );
    let runs = kinds.iter().map(|&kind| {
        let dir = root.path().join(kind.to_string().replace(' ', "_"));
        async move {
            std::fs::create_dir_all(&dir)?;
            soak::soak(kind, &dir, args.rate, minutes, |i, m| {
                println!(
                    "{kind} | {i} | {} | {} | {:.2} | {:.1} | {} | {:.1}",
                    m.done, m.backlog, m.claim_p99_ms, m.storage_mb, m.dead_rows, m.worker_mb
                );
            })
            .await
            .map(|ms| (kind, ms))
        }
    });
    let mut over = 0;
    for result in futures::future::join_all(runs).await {
        let (kind, minutes) = result?;
        println!(
            "\n{kind}: the last {} minutes against the first {}",
            soak::ENDS,
            soak::ENDS
        );
        for (name, first, last, ratio) in soak::ratios(&minutes) {
            let verdict = if ratio <= soak::GOAL { "ok" } else { "GROWS" };
            if ratio > soak::GOAL {
                over += 1;
            }
            println!("  {name:>13}: {first:>10.2} -> {last:>10.2}  {ratio:.2}x  {verdict}");
        }
    }
    Ok(over)
}
