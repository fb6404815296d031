//! A library worker for fault runs: `relayq_core::worker::Worker` embedded in a program
//! of its own, as an application would embed it, beside the `relayq work` processes.
//!
//! Its handler is application code: it runs the job's `command` with `sh -c` in a
//! process group of its own and kills that group when the worker drops the handler
//! (lease lost, stopped at the lease's end, shutdown deadline). Unlike `relayq work` it
//! has no guard process, so a command could outlive a worker that is SIGKILLed or
//! frozen; the torture's commands last under a second against a lease of seconds.
//!
//! `relayq-torture-worker URL QUEUE CONCURRENCY LEASE_MS NAME`; SIGTERM stops it
//! gracefully within 5 s. `relayq-torture-worker __exec DEADLINE_NS COMMAND` is how the
//! handler starts a command: checked against the lease's deadline after the fork.

#![allow(
    clippy::print_stderr,
    reason = "a worker process of the torture: its log is stderr"
)]

use std::{os::unix::process::CommandExt as _, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use nix::{
    sys::signal::{Signal, killpg},
    time::{ClockId, clock_gettime},
    unistd::Pid,
};
use relayq::{
    Backend, ClaimedJob,
    worker::{JobContext, JobError, Worker},
};
use tokio::signal::unix::{SignalKind, signal};

/// How long the worker waits for a restarting server before it gives up (the torture
/// restarts a worker that ends).
const CONNECT_FOR: Duration = Duration::from_secs(60);

/// The exit code of `__exec` when the deadline passed before the command started.
const TOO_LATE: u8 = 75;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [exec, deadline, command] = args.as_slice()
        && exec == "__exec"
    {
        return exec_before(deadline, command);
    }
    serve()
}

/// In the forked child, on the machine's monotonic clock (which runs on while a
/// process is stopped): becomes `sh -c COMMAND` if the deadline is still ahead, so
/// a worker frozen anywhere between its handler's start and the fork cannot start a
/// command that the job's next attempt may already be running.
fn exec_before(deadline_ns: &str, command: &str) -> ExitCode {
    let Ok(deadline) = deadline_ns.parse::<u128>() else {
        eprintln!("relayq-torture-worker: __exec: bad DEADLINE_NS {deadline_ns:?}");
        return ExitCode::from(2);
    };
    if monotonic().as_nanos() >= deadline {
        eprintln!("relayq-torture-worker: __exec: the lease's deadline passed before the start");
        return ExitCode::from(TOO_LATE);
    }
    let e = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("LC_ALL", "C")
        .exec();
    eprintln!("relayq-torture-worker: __exec: cannot start sh: {e}");
    ExitCode::from(2)
}

/// The machine's `CLOCK_MONOTONIC`.
fn monotonic() -> Duration {
    Duration::from(clock_gettime(ClockId::CLOCK_MONOTONIC).expect("Linux has CLOCK_MONOTONIC"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn serve() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relayq-torture-worker: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, queue, concurrency, lease_ms, name] = args.as_slice() else {
        anyhow::bail!("usage: relayq-torture-worker URL QUEUE CONCURRENCY LEASE_MS NAME");
    };
    let concurrency: u32 = concurrency.parse().context("CONCURRENCY")?;
    let lease = Duration::from_millis(lease_ms.parse().context("LEASE_MS")?);
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let backend = connect(url).await?;
    let worker = Worker::builder(backend, [queue.clone()])
        .name(name.clone())
        .concurrency(concurrency)
        .lease(lease)
        .shutdown_timeout(Duration::from_secs(5))
        .handler(handle)
        .build()?
        .spawn();
    eprintln!("library worker {name} serving {queue:?} with {concurrency} slots");
    term.recv().await;
    eprintln!("SIGTERM: stopping");
    let report = worker.shutdown().await?;
    eprintln!("stopped: {report:?}");
    Ok(())
}

/// Connects, waiting for a server that is restarting.
async fn connect(url: &str) -> anyhow::Result<Arc<dyn Backend>> {
    let deadline = tokio::time::Instant::now() + CONNECT_FOR;
    loop {
        match relayq::connect(url).await {
            Ok(b) => return Ok(b),
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("connect"),
        }
    }
}

/// Runs the payload's `command`; a non-zero exit is a retryable failure.
async fn handle(job: ClaimedJob) -> Result<(), JobError> {
    let payload: serde_json::Value = serde_json::from_slice(&job.payload)
        .map_err(|e| JobError::permanent(format!("payload: {e}")))?;
    let command = payload["command"]
        .as_str()
        .ok_or_else(|| JobError::permanent("payload has no command"))?;
    // A worker frozen after the handler started may thaw past the lease's stop, and
    // the job may run elsewhere by then: the command starts through `__exec`, which
    // checks the deadline after the fork, as `relayq work`'s guard does. The clock is
    // read before `Instant::now()`, so a freeze between the readings moves the
    // deadline earlier, never later.
    let mut deadline_ns = u128::MAX;
    if let Some(d) = JobContext::current().and_then(|c| c.deadline()) {
        let mono = monotonic();
        let left = d
            .stop_at
            .saturating_duration_since(tokio::time::Instant::now());
        deadline_ns = (mono + left).as_nanos();
    }
    let exe = std::env::current_exe().map_err(|e| JobError::retryable(format!("exe: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .arg("__exec")
        .arg(deadline_ns.to_string())
        .arg(command)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| JobError::retryable(format!("cannot start: {e}")))?;
    let mut group = KillGroup(child.id().map(|id| Pid::from_raw(id.cast_signed())));
    let status = child
        .wait()
        .await
        .map_err(|e| JobError::retryable(format!("wait: {e}")))?;
    // Ended by itself: its group id may be reused from now on.
    group.0 = None;
    if status.success() {
        Ok(())
    } else if status.code() == Some(TOO_LATE.into()) {
        Err(JobError::retryable(
            "the lease's deadline passed before the command could start",
        ))
    } else {
        Err(JobError::retryable(format!("command ended: {status}")))
    }
}

/// Kills a command's whole process group when the handler is dropped midway: `sh`, the
/// script and its `sleep` alike, not only the child `kill_on_drop` reaches.
struct KillGroup(Option<Pid>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}
