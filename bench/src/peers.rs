//! The peers, built and run as a separate program (`bench/peers`, a workspace of its
//! own: apalis 1.0 and graphile_worker 0.14 use sqlx 0.8, relayq sqlx 0.9, and two
//! SQLite libraries cannot link into one binary). One invocation is one measurement
//! and prints one JSON line.

use std::{path::PathBuf, process::Stdio, time::Duration};

use serde_json::Value;

use crate::Row;

/// The longest a peer's measurement may take; its slowest (apalis-postgres draining
/// 50,000 jobs) takes about 15 s. The phases run for a set time, and get that plus this.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// Peers and the scenarios each runs.
pub const PEERS: &[(&str, &[&str])] = &[
    (
        "apalis-postgres",
        &["enqueue-single", "enqueue-batch", "drain", "latency"],
    ),
    (
        "apalis-redis",
        &["enqueue-single", "enqueue-batch", "drain", "latency"],
    ),
    (
        "apalis-sqlite",
        &["enqueue-single", "enqueue-batch", "drain", "latency"],
    ),
    (
        "graphile-worker",
        &[
            "enqueue-single",
            "enqueue-batch",
            "drain",
            "latency",
            "groups",
            "phases",
        ],
    ),
];

/// What one peer run measured.
pub struct Measured {
    pub value: f64,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    pub settings: String,
}

pub struct Peers {
    binary: Option<PathBuf>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers")
}

impl Peers {
    /// Builds the peers' program (once; cargo caches it) unless `skip`. A failed build
    /// leaves the peers out with one line saying why.
    #[allow(clippy::print_stderr)]
    pub fn build(skip: bool) -> Self {
        if skip {
            return Self { binary: None };
        }
        let binary = dir().join("target/release/relayq-bench-peers");
        let mut cargo = std::process::Command::new(env!("CARGO"));
        // The target directory is named, so a `CARGO_TARGET_DIR` set for the bench's
        // own build does not put the peers' program where it is not looked for.
        cargo
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(dir().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(dir().join("target"))
            .stdout(Stdio::null());
        // Under rustup, pin the toolchain this bench was built with. Otherwise a
        // dependency's own `rust-toolchain.toml` (atoi 2.0 names 1.57.0) picks the
        // compiler when the bench runs outside `cargo run`, and the build fails.
        if std::env::var_os("RUSTUP_TOOLCHAIN").is_none()
            && let Some(toolchain) = option_env!("RUSTUP_TOOLCHAIN")
        {
            cargo.env("RUSTUP_TOOLCHAIN", toolchain);
        }
        // `cargo run` hands the bench its package's variables (`CARGO_MANIFEST_DIR`,
        // `CARGO_PKG_*`, ...), and this build would inherit them. ring's build script
        // reruns when `CARGO_MANIFEST_DIR` changes, so a `cargo run` after any other
        // build of the peers (from a shell, or by this binary started directly)
        // rebuilt ring and all that depends on it (rustls, sqlx, apalis,
        // graphile_worker): 3.5 minutes here. Without them the build sees what a
        // `cargo build` from a shell sees, however the bench was started.
        for (key, _) in std::env::vars_os() {
            if let Some(k) = key.to_str()
                && (k.starts_with("CARGO_PKG_")
                    || k.starts_with("CARGO_MANIFEST_")
                    || [
                        "CARGO_CRATE_NAME",
                        "CARGO_BIN_NAME",
                        "CARGO_PRIMARY_PACKAGE",
                    ]
                    .contains(&k))
            {
                cargo.env_remove(k);
            }
        }
        match cargo.status() {
            Ok(s) if s.success() && binary.exists() => Self {
                binary: Some(binary),
            },
            Ok(s) if s.success() => {
                eprintln!(
                    "peers left out: bench/peers built, but {} is missing",
                    binary.display()
                );
                Self { binary: None }
            }
            other => {
                eprintln!("peers left out: building bench/peers failed ({other:?})");
                Self { binary: None }
            }
        }
    }

    /// The peers that run `scenario`.
    pub fn running(&self, scenario: &str) -> Vec<&'static str> {
        if self.binary.is_none() {
            return Vec::new();
        }
        PEERS
            .iter()
            .filter(|(_, s)| s.contains(&scenario))
            .map(|(p, _)| *p)
            .collect()
    }

    /// Runs `peer` on `scenario` once.
    pub async fn run(
        &self,
        peer: &str,
        scenario: &str,
        jobs: usize,
        concurrency: u32,
    ) -> anyhow::Result<Measured> {
        // apalis-sqlite's pool keeps SQLite's FULL sync on all but one connection, and
        // its rate falls as its table grows (about 1,700 jobs/s at 500 jobs, 237 at
        // 5,000 here): it gets a fiftieth of the jobs, at least 500, or it alone would
        // take minutes per run (a tenth took 63 s of `--all`'s concurrency-16 drains).
        let jobs = if peer == "apalis-sqlite" && matches!(scenario, "drain" | "enqueue-single") {
            (jobs / 50).max(500)
        } else if peer == "apalis-redis" && scenario == "drain" {
            // Its fetch script moves every due job in one Lua call, which Redis caps
            // near 8,000 values: more jobs than that and the drain fails. Its figure
            // is for 7,000 jobs (the settings say so).
            jobs.min(7_000)
        } else {
            jobs
        };
        let args = ["--jobs", &jobs.to_string()];
        let v = self
            .invoke(peer, scenario, &args, concurrency, PEER_TIMEOUT)
            .await?;
        Ok(Measured {
            value: v["value"]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("{peer}: no value in {v}"))?,
            p99: v["p99"].as_f64(),
            max: v["max"].as_f64(),
            settings: format!(
                "jobs={jobs}; {}",
                v["settings"].as_str().unwrap_or_default()
            ),
        })
    }

    /// Runs `peer` through the phases of `crate::phases` at `rate` (worker concurrency
    /// 16); its rows, labelled with its name, each with its settings as the note.
    pub async fn phases(&self, peer: &str, rate: u64, phase: Duration) -> anyhow::Result<Vec<Row>> {
        let secs = phase.as_secs().max(1);
        // Three phases of a set length, and the set-up and clean-up around them.
        let timeout = Duration::from_secs(3 * secs) + PEER_TIMEOUT;
        let (rate, secs) = (rate.to_string(), secs.to_string());
        // `--jobs` is required by the program and not used by this scenario.
        let args = ["--jobs", "1", "--rate", &rate, "--phase-secs", &secs];
        let v = self.invoke(peer, "phases", &args, 16, timeout).await?;
        let note = v["settings"].as_str().unwrap_or_default();
        let rows = v["rows"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("{peer}: no rows in {v}"))?;
        rows.iter()
            .map(|r| {
                let unit = r["unit"].as_str().unwrap_or_default();
                Ok(Row {
                    scenario: r["scenario"].as_str().unwrap_or_default().to_owned(),
                    target: peer.to_owned(),
                    // A figure the peer could not take (no pickups in a phase) is null.
                    value: r["value"].as_f64().unwrap_or(f64::NAN),
                    unit: ["jobs/s", "ms", "jobs", "s", "rows", "MB"]
                        .into_iter()
                        .find(|u| *u == unit)
                        .ok_or_else(|| anyhow::anyhow!("{peer}: unknown unit {unit:?}"))?,
                    note: note.to_owned(),
                })
            })
            .collect()
    }

    /// One run of the peers' program: its JSON line. Vacuums first for a PostgreSQL
    /// peer; a run that outlasts `timeout` is killed.
    async fn invoke(
        &self,
        peer: &str,
        scenario: &str,
        args: &[&str],
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let binary = self
            .binary
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("peers not built"))?;
        let mut cmd = tokio::process::Command::new(binary);
        cmd.args(["--peer", peer, "--scenario", scenario])
            .args(args)
            .args(["--concurrency", &concurrency.to_string()]);
        if let Ok(url) = std::env::var("RELAYQ_POSTGRES_URL") {
            if matches!(peer, "apalis-postgres" | "graphile-worker") {
                crate::targets::vacuum(&url).await?;
            }
            cmd.args(["--postgres-url", &url]);
        }
        if let Ok(url) = std::env::var("RELAYQ_REDIS_URL") {
            cmd.args(["--redis-url", &url]);
        }
        // A peer run that hangs (apalis-postgres's latency run once sat idle for over
        // ten minutes) is killed and reported, not waited for.
        let out = tokio::time::timeout(
            timeout,
            cmd.stderr(Stdio::inherit()).kill_on_drop(true).output(),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{peer} {scenario} took over {timeout:?}; killed"))??;
        anyhow::ensure!(
            out.status.success(),
            "{peer} {scenario} failed ({})",
            out.status
        );
        let line = String::from_utf8(out.stdout)?;
        Ok(serde_json::from_str(line.trim())?)
    }
}
