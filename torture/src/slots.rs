//! The schedule cell (SPEC S2, S3): a per-second schedule in a queue of its own, fired
//! by every `relayq work` process of the run (three of the four by default, the fourth
//! being the library worker) while the faults go on: SIGKILLs, SIGSTOPs past the
//! lease, server crashes and restarts, cut connections. Every slot from the schedule's
//! start to its last one must be enqueued exactly once: its policy catches up every
//! slot of the last hour, so none may be missing, and none may be there twice.
//!
//! A scheduler's own clock is never read: slots are judged by the server's time, so a
//! process with a skewed clock fires the same slots (the fire is refused in the
//! backend when a slot lies in the server's future). One more `relayq work` process,
//! outside the faults, serves the cell's queue alone with its clock 30 s ahead
//! ([`Skewed`]); a mark ahead of the server's time at the end is a violation.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use chrono::{DateTime, TimeDelta, Utc};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use relayq::{
    Backend, NewJob,
    schedule::{Missed, Schedule},
};

use crate::{check::Check, run::queue};

/// The schedule's name.
const NAME: &str = "tick";
/// How far behind the server's time the last slot may be when the workers stop.
const BEHIND: TimeDelta = TimeDelta::seconds(10);

/// The cell of one run: its queue, and the mark the schedule started from.
pub struct Cell {
    /// The queue the schedule and its jobs live in.
    pub queue: String,
    start: DateTime<Utc>,
}

/// Stores the schedule; the workers fire it from then on.
///
/// # Errors
/// When the backend refuses it for a minute.
pub async fn start(backend: &dyn Backend) -> anyhow::Result<Cell> {
    let q = format!("{}.schedule", queue());
    let payload = serde_json::json!({"command": "true", "name": NAME, "env": {"LC_ALL": "C"}});
    let s = Schedule::new(&q, NAME, "* * * * * *")
        .missed(Missed::all_within(Duration::from_secs(3600)))
        .job(NewJob::new(&q, payload.to_string().into_bytes()));
    crate::run::retry("put_schedule", || backend.put_schedule(&s)).await?;
    let (start, _) = read(backend, &q).await?;
    Ok(Cell { queue: q, start })
}

/// The schedule's mark and the server's time.
async fn read(backend: &dyn Backend, q: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let (rows, now) =
        crate::run::retry("schedules", || backend.stored_schedules_unchecked(q)).await?;
    let row = rows
        .into_iter()
        .find(|r| r.name == NAME)
        .ok_or_else(|| anyhow::anyhow!("the schedule of {q} is gone"))?;
    Ok((row.mark, now))
}

impl Cell {
    /// The server's time, read just before the workers are told to stop.
    ///
    /// # Errors
    /// When the backend cannot be read for a minute.
    pub async fn stopping(&self, backend: &dyn Backend) -> anyhow::Result<DateTime<Utc>> {
        Ok(read(backend, &self.queue).await?.1)
    }

    /// Checks, after the workers stopped, that every slot from the start to the mark
    /// has one job, and that the mark kept up until `stopping`.
    ///
    /// # Errors
    /// When the backend cannot be read for a minute.
    pub async fn check(
        &self,
        backend: &dyn Backend,
        stopping: DateTime<Utc>,
    ) -> anyhow::Result<Check> {
        let (mark, now) = read(backend, &self.queue).await?;
        // Per-second slots after the start, up to the mark: whole seconds.
        let slots = mark.timestamp() - self.start.timestamp();
        let stats = crate::run::retry("queue_stats", || backend.queue_stats(&self.queue)).await?;
        let jobs = stats.total();
        let mut violations = Vec::new();
        if i64::try_from(jobs).unwrap_or(i64::MAX) != slots {
            violations.push(format!(
                "{jobs} jobs stored for the {slots} slots from {} to {mark}",
                self.start
            ));
        }
        if mark > now {
            violations.push(format!(
                "the mark {mark} is ahead of the server's time {now}: a slot fired early"
            ));
        }
        if mark < stopping - BEHIND {
            violations.push(format!(
                "the last slot fired was {mark}, {} s before the workers were stopped",
                (stopping - mark).num_seconds()
            ));
        }
        Ok(Check {
            name: "schedule: each slot enqueued once",
            checked: usize::try_from(slots).unwrap_or(0),
            violations,
            excused: Vec::new(),
        })
    }
}

/// Debian's libfaketime (package `libfaketime`), for the scheduler whose clock runs
/// ahead: the multi-threaded build, since `relayq work` runs threads.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// How far ahead that scheduler's clock runs.
const SKEW_SECS: i64 = 30;

/// A `relayq work` process serving the cell's queue alone, its clock [`SKEW_SECS`]
/// ahead of the machine's (libfaketime; its timers keep the real monotonic clock). It
/// stands outside the run's faults: it shows that a scheduler's own clock fires no slot
/// early, since slots are judged by the server's time. Its jobs are `true`: nothing it
/// runs writes to the ledger.
pub struct Skewed {
    child: Option<Child>,
    /// What was run, or why not, for the run's figures.
    pub note: String,
}

impl Cell {
    /// Starts the skewed scheduler, or says why it could not. `embedded`: the
    /// database has no server (SQLite), so its clock is each process's own, the
    /// machine's, which every process opening the file shares; a process with a clock
    /// of its own would be a server with a wrong clock, and is not run.
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn start_skewed(
        &self,
        exe: &Path,
        db: &str,
        logs: &Path,
        embedded: bool,
    ) -> anyhow::Result<Skewed> {
        let none = |note: String| Ok(Skewed { child: None, note });
        if embedded {
            return none(
                "not run: SQLite's clock is the machine's, which its processes share".into(),
            );
        }
        if !Path::new(FAKETIME).exists() {
            return none(format!(
                "not run: no {FAKETIME} (apt-get install libfaketime)"
            ));
        }
        let shifted = faked(Command::new("date").arg("+%s")).output()?;
        let ahead = String::from_utf8_lossy(&shifted.stdout)
            .trim()
            .parse::<i64>()
            .map_or(0, |t| t - Utc::now().timestamp());
        if !(SKEW_SECS - 5..=SKEW_SECS + 5).contains(&ahead) {
            return none(format!(
                "not run: libfaketime moved `date` by {ahead} s, not {SKEW_SECS}"
            ));
        }
        std::fs::create_dir_all(logs)?;
        let log = std::fs::File::create(logs.join("skewed.log"))?;
        let child = faked(
            Command::new(exe)
                .args(["--db", db, "work", "--queue", &self.queue])
                .args([
                    "--name",
                    "skewed",
                    "--concurrency",
                    "2",
                    "--shutdown-timeout",
                    "5s",
                ]),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
        Ok(Skewed {
            child: Some(child),
            note: format!("a scheduler {ahead} s ahead ran throughout (libfaketime)"),
        })
    }
}

/// `cmd` under libfaketime, [`SKEW_SECS`] ahead.
fn faked(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_PRELOAD", FAKETIME)
        .env("FAKETIME", format!("+{SKEW_SECS}s"))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
}

impl Skewed {
    /// SIGTERM, then SIGKILL after 20 s.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Skewed {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
