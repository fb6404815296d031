//! Helpers for the CLI tests: a temp folder with its own database, and the built binary.

#![allow(dead_code)] // Each test file uses its own part of these helpers.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A temp folder with a SQLite database; every command runs there.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub db: String,
}

/// What a command did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: &Output) -> Self {
        Self {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics with both streams unless the exit code is `code`.
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = format!("sqlite://{}", dir.path().join("relayq.db").display());
        Self { dir, db }
    }

    /// A temp folder whose commands use the database at `url` (a server's).
    pub fn with_db(url: &str) -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            db: url.to_owned(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The binary with `--db` set, run in the temp folder, with no RELAYQ_* from outside.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_relayq"));
        cmd.current_dir(self.dir.path())
            .env_remove("RELAYQ_DB")
            .env_remove("RELAYQ_QUEUE")
            .arg("--db")
            .arg(&self.db)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the binary to its end.
    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(&self.cmd(args).output().expect("run relayq"))
    }

    /// Starts the binary and returns at once.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relayq")
    }

    /// `relayq status -q QUEUE --json`, parsed.
    pub fn status(&self, queue: &str) -> Value {
        let out = self.run(&["status", "-q", queue, "--json"]).expect_code(0);
        serde_json::from_str(&out.stdout).expect("status JSON")
    }

    /// The count of `state` in `relayq status QUEUE --json`.
    pub fn count(&self, queue: &str, state: &str) -> u64 {
        self.status(queue)["stats"]["counts"][state]
            .as_u64()
            .unwrap_or(0)
    }

    /// Runs `plan` (a path relative to the workspace) with a JSON report; returns the run
    /// and the report.
    pub fn run_plan(&self, plan: &Path, extra: &[&str]) -> (Run, Value) {
        let report = self.path("report.json");
        let mut args = vec![
            "run",
            plan.to_str().expect("utf-8 path"),
            "--report-json",
            report.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        let run = self.run(&args);
        let json = std::fs::read_to_string(&report).map_or(Value::Null, |t| {
            serde_json::from_str(&t).expect("report JSON")
        });
        (run, json)
    }
}

/// A file of the workspace's `examples/` folder.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

/// Polls `check` every 20 ms until it returns `Some`, failing after `limit`.
pub fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A timestamp of the JSON report.
pub fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map_or_else(|| panic!("not a timestamp: {v}"), |t| t.with_timezone(&Utc))
}

/// The jobs of a report, by name.
pub fn job<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["name"] == name)
        .unwrap_or_else(|| panic!("no job {name:?} in the report"))
}

/// How a case says it did not run: see [`skipped`].
const SKIP: &str = "relayq-test-skip: ";

/// What a case returns when its backend refuses what it tests by design (a backend
/// that keeps no limit keys refuses `--limit-key`): [`per_backend`] reports the case
/// as ignored with `reason`, not as passed.
pub fn skipped(reason: &str) -> libtest_mimic::Failed {
    format!("{SKIP}{reason}").into()
}

/// One trial per backend and case, named `backend::case`: SQLite always, and every
/// backend with a server that this CLI has (read off `relayq::drivers()`, so a new
/// backend is tested without a change here). A server whose variable is unset is
/// reported as ignored with the reason, or as failed when `RELAYQ_REQUIRE` names it. A
/// case fails by returning an error or by panicking.
pub fn per_backend<F>(cases: &[(&'static str, F)]) -> Vec<libtest_mimic::Trial>
where
    F: Fn(&Env) -> Result<(), libtest_mimic::Failed> + Copy + Send + 'static,
{
    use libtest_mimic::{Completion, Trial};
    let mut trials = Vec::new();
    for driver in relayq::drivers() {
        // Of the embedded backends, the CLI's commands share SQLite's file only.
        let server = match driver.server {
            Some(server) => Some(server),
            None if driver.name == "sqlite" => None,
            None => continue,
        };
        let backend = driver.name;
        let url = server.and_then(|s| s.open_url());
        let required = server.is_some_and(|s| s.required());
        for &(name, case) in cases {
            let url = url.clone();
            let trial = Trial::ignorable_test(format!("{backend}::{name}"), move || {
                let env = match (server, url) {
                    (None, _) => Env::new(),
                    (Some(_), Some(url)) => Env::with_db(&url),
                    (Some(s), None) if required => {
                        return Err(format!(
                            "{} is unset, but RELAYQ_REQUIRE names {backend}",
                            s.env_var
                        )
                        .into());
                    }
                    (Some(s), None) => {
                        return Ok(Completion::ignored_with(format!(
                            "no {backend} server: {} unset",
                            s.env_var
                        )));
                    }
                };
                match case(&env) {
                    // A case the backend refuses by design is reported as not run.
                    Err(f) if f.message().is_some_and(|m| m.starts_with(SKIP)) => {
                        let reason = f.message().unwrap_or_default();
                        Ok(Completion::ignored_with(reason[SKIP.len()..].to_owned()))
                    }
                    done => done.map(|()| Completion::Completed),
                }
            });
            trials.push(trial.with_kind(backend));
        }
    }
    trials
}
