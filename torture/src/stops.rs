//! The live-cancel cell (SPEC B6, B7, B8): commands that would run for a minute, in a
//! queue every `relayq work` process of the run serves, stopped while they run under
//! the run's faults. When the run's cancel fault fires, the cell enqueues four single
//! jobs, a batch of four, and a `Halt` batch of three with a fourth job that dies after
//! two seconds, and two more singles; once they run (or after 30 s) it cancels the
//! first four singles one by one and the batch whole, the dying job halts its batch,
//! and once it has (or after 30 s more) the cell purges its queue, which stops the last
//! two singles (SPEC B9).
//!
//! Checked at the end, from the cell's own ledger (the commands' start and end lines)
//! and the database: no cancelled command ran to its end (it was stopped, by its
//! worker at once or, when the worker was frozen or killed, by its guard at the
//! lease's end), none started after its cancel was acknowledged, and every job ended
//! `cancelled` (a late completion would have made it `succeeded`), the dying one
//! `dead`.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use relayq::{Backend, EnqueueExt, JobId, JobState, NewJob, OnFailure};
use tokio::task::JoinHandle;

use crate::{check::Check, ledger::Ledger, run::retry};

/// Every command of the cell: `bash long.sh DIR KEY SECONDS RC`.
///
/// A watcher in a session of its own (so the kill of the command's process group
/// spares it) writes `K KEY PID MICROS` once the shell is gone or a zombie: when the
/// command was stopped, to within 20 ms.
pub const SCRIPT: &str = r#"# long.sh DIR KEY SECONDS RC
L="$1/cancel-ledger"
echo "S $2 $$ ${EPOCHREALTIME//[!0-9]/}" >> "$L"
setsid bash -c 'p=$1; while s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) && [ -n "$s" ] && [ "$s" != Z ]; do sleep 0.02; done; echo "K $2 $p ${EPOCHREALTIME//[!0-9]/}" >> "$3"' _ $$ "$2" "$L" </dev/null >/dev/null 2>&1 &
sleep "$3"
echo "E $2 $$ ${EPOCHREALTIME//[!0-9]/} $4" >> "$L"
exit "$4"
"#;

/// How long a command would run if nothing stopped it.
const LONG_SECS: u32 = 60;
/// How long the cell waits for its jobs to run before it cancels anyway.
const WAIT_RUNNING: Duration = Duration::from_secs(30);

/// One job of the cell.
#[derive(Debug, Clone)]
struct Job {
    key: String,
    id: JobId,
    /// How it is stopped: `cancel`, `batch`, `halt` or `purge`; `die` for the dying
    /// job.
    how: &'static str,
}

/// What the cell did, for the check.
#[derive(Debug, Default)]
pub struct Done {
    jobs: Vec<Job>,
    /// When each cancel (or the dying job's end) was acknowledged, microseconds since
    /// the epoch on the machine's clock, by job key.
    acked: BTreeMap<String, i64>,
    /// How many cell jobs were running when the cancels were sent.
    running: usize,
    /// Whether the purge came before the dying job had died: the purge may then have
    /// cancelled it first.
    purged_early: bool,
}

/// The cell's task, started at the run's cancel fault.
pub struct Cell {
    queue: String,
    dir: PathBuf,
    /// The workers' lease, in microseconds.
    lease_us: i64,
    task: Option<JoinHandle<anyhow::Result<Done>>>,
}

impl Cell {
    /// The cell of a run whose folder is `dir` and whose workers lease jobs for `lease`;
    /// its queue is one more for the workers.
    #[must_use]
    pub fn new(dir: PathBuf, lease: Duration) -> Self {
        Self {
            queue: format!("{}.cancel", crate::run::queue()),
            dir,
            lease_us: i64::try_from(lease.as_micros()).unwrap_or(i64::MAX),
            task: None,
        }
    }

    /// The queue the workers must serve.
    #[must_use]
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Starts the cell's work in the background (once).
    ///
    /// # Errors
    /// When the script cannot be written.
    pub fn fire(&mut self, backend: Arc<dyn Backend>) -> anyhow::Result<()> {
        if self.task.is_some() {
            return Ok(());
        }
        std::fs::write(self.dir.join("long.sh"), SCRIPT)?;
        std::fs::write(self.dir.join("cancel-ledger"), "")?;
        let (q, dir) = (self.queue.clone(), self.dir.clone());
        self.task = Some(tokio::spawn(work(backend, q, dir)));
        Ok(())
    }

    /// Checks the cell once the workers have stopped.
    ///
    /// # Errors
    /// When the database cannot be read for a minute.
    pub async fn check(self, backend: &dyn Backend) -> anyhow::Result<(Check, String)> {
        let name = "live cancel: stopped at once, never again";
        let Some(task) = self.task else {
            let none = Check {
                name,
                checked: 0,
                violations: Vec::new(),
                excused: Vec::new(),
            };
            return Ok((none, "not run: the cancel fault never fired".into()));
        };
        let done = task.await??;
        let text = std::fs::read_to_string(self.dir.join("cancel-ledger")).unwrap_or_default();
        let (kills, text): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| l.starts_with("K "));
        let ledger = Ledger::parse(&text.join("\n"));
        // Key and shell pid → when the shell was gone.
        let gone: BTreeMap<(String, u32), i64> = kills
            .iter()
            .filter_map(
                |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                    ["K", key, pid, t] => {
                        Some((((*key).to_owned(), pid.parse().ok()?), t.parse().ok()?))
                    }
                    _ => None,
                },
            )
            .collect();
        let mut stops_ms = Vec::new();
        let mut violations = Vec::new();
        for job in &done.jobs {
            let runs = ledger.runs_of(&job.key);
            let want = if job.how == "die" {
                JobState::Dead
            } else {
                JobState::Cancelled
            };
            let got = retry("job", || backend.job(&self.queue, job.id))
                .await?
                .state;
            let purged_first = job.how == "die" && done.purged_early && got == JobState::Cancelled;
            if got != want && !purged_first {
                violations.push(format!("{} ({}) ended {got}, not {want}", job.key, job.how));
            }
            if job.how == "die" {
                continue;
            }
            if let Some(r) = runs.iter().find(|r| r.end_us.is_some()) {
                violations.push(format!(
                    "{} ({}): its command (pid {}) ran to its end: never stopped",
                    job.key, job.how, r.pid
                ));
            }
            let Some(&at) = done.acked.get(&job.key) else {
                continue;
            };
            // How long after the cancel (or its own start, when its shell got going
            // only after the cancel) each command that ran then was stopped.
            for r in runs.iter().filter(|r| r.end_us.is_none()) {
                if let Some(end) = gone.get(&(job.key.clone(), r.pid)) {
                    stops_ms.push((end - at.max(r.start_us)).max(0) / 1000);
                }
            }
            // A command claimed before the cancel may start its shell a little after
            // it; one starting later than a lease after it came from a claim made after
            // the cancel, which must never happen.
            if let Some(r) = runs.iter().find(|r| r.start_us > at + self.lease_us) {
                violations.push(format!(
                    "{} ({}): a run started {} ms after the cancel was acknowledged",
                    job.key,
                    job.how,
                    (r.start_us - at) / 1000
                ));
            }
        }
        let ran = done
            .jobs
            .iter()
            .filter(|j| !ledger.runs_of(&j.key).is_empty())
            .count();
        stops_ms.sort_unstable();
        // Reported, not judged: a fault at the cancel (a cut listener, a frozen or killed
        // worker, a server restart) delays a stop by design; the conformance cases and
        // the bench judge the time without faults.
        let median = stops_ms.get(stops_ms.len() / 2).copied();
        let note = format!(
            "{} jobs: {} running when the cancels were sent, {ran} ran at some point; \
             cancel to command stop, ms: {stops_ms:?} (median {median:?})",
            done.jobs.len(),
            done.running
        );
        let check = Check {
            name,
            checked: done.jobs.len(),
            violations,
            excused: Vec::new(),
        };
        Ok((check, note))
    }
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Enqueues the cell's jobs, waits for them to run, cancels them.
async fn work(backend: Arc<dyn Backend>, q: String, dir: PathBuf) -> anyhow::Result<Done> {
    let dir_s = dir.to_str().unwrap_or_default().to_owned();
    let command = |key: &str, secs: u32, rc: i32| {
        serde_json::json!({
            "command": format!("bash {dir_s}/long.sh {dir_s} {key} {secs} {rc}"),
            "name": key,
        })
        .to_string()
        .into_bytes()
    };
    // Ahead of the run's jobs, so that the workers take them at once. The dedupe key
    // makes a retried enqueue (its first answer lost to a connection kill) return the
    // job stored the first time instead of storing a second one.
    let job = |key: &str, secs, rc| {
        NewJob::new(&q, command(key, secs, rc))
            .priority(-100)
            .max_attempts(25)
            .dedupe_key(key)
    };
    let mut done = Done::default();
    let singles = (0..4)
        .map(|i| (format!("c{i}"), "cancel"))
        .chain((0..2).map(|i| (format!("p{i}"), "purge")));
    for (key, how) in singles {
        let id = retry("enqueue", || backend.enqueue_one(job(&key, LONG_SECS, 0)))
            .await?
            .id;
        done.jobs.push(Job { key, id, how });
    }
    let batch = retry("open_batch", || backend.open_batch(&q, OnFailure::Continue)).await?;
    let halt = retry("open_batch", || backend.open_batch(&q, OnFailure::Halt)).await?;
    for (b, how, keys) in [
        (&batch, "batch", ["b0", "b1", "b2", "b3"]),
        (&halt, "halt", ["h0", "h1", "h2", "h3"]),
    ] {
        let jobs: Vec<NewJob> = keys
            .iter()
            .map(|k| {
                let dies = how == "halt" && *k == "h3";
                let j = if dies {
                    job(k, 2, 1).max_attempts(1)
                } else {
                    job(k, LONG_SECS, 0)
                };
                j.in_batch(b.id, 1)
            })
            .collect();
        let ids = retry("enqueue", || backend.enqueue(jobs.clone())).await?;
        for (k, e) in keys.iter().zip(ids) {
            let how = if *k == "h3" { "die" } else { how };
            done.jobs.push(Job {
                key: (*k).to_owned(),
                id: e.id,
                how,
            });
        }
        retry("seal", || backend.seal(b)).await?;
    }
    done.running = wait_running(&*backend, &q, &done.jobs).await;
    for j in done.jobs.iter().filter(|j| j.how == "cancel") {
        retry("cancel_job", || backend.cancel_job(&q, j.id)).await?;
        done.acked.insert(j.key.clone(), now_us());
    }
    retry("cancel_batch", || backend.cancel_batch(&batch)).await?;
    let at = now_us();
    for j in done.jobs.iter().filter(|j| j.how == "batch") {
        done.acked.insert(j.key.clone(), at);
    }
    let dying = done.jobs.iter().find(|j| j.how == "die").map(|j| j.id);
    done.purged_early = !wait_finished(&*backend, &q, dying).await;
    retry("purge", || backend.purge(&q)).await?;
    let at = now_us();
    for j in done.jobs.iter().filter(|j| j.how == "purge") {
        done.acked.insert(j.key.clone(), at);
    }
    Ok(done)
}

/// Waits until job `id` has finished, or [`WAIT_RUNNING`] passes; whether it did.
async fn wait_finished(backend: &dyn Backend, q: &str, id: Option<JobId>) -> bool {
    let Some(id) = id else { return true };
    let deadline = tokio::time::Instant::now() + WAIT_RUNNING;
    while tokio::time::Instant::now() < deadline {
        if backend
            .job(q, id)
            .await
            .is_ok_and(|j| j.state.is_finished())
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Waits until the cell's jobs that can run all run (the `Halt` batch's and the
/// singles and the batch's), or [`WAIT_RUNNING`] passes; returns how many run.
async fn wait_running(backend: &dyn Backend, q: &str, jobs: &[Job]) -> usize {
    let deadline = tokio::time::Instant::now() + WAIT_RUNNING;
    let mut running = 0;
    while tokio::time::Instant::now() < deadline {
        if let Ok(now) = backend.running(q).await {
            running = jobs
                .iter()
                .filter(|j| now.iter().any(|r| r.id == j.id))
                .count();
            if running >= jobs.len() - 1 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running
}
