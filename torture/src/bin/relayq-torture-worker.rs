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
//! gracefully within 5 s.

#![allow(
    clippy::print_stderr,
    reason = "a worker process of the torture: its log is stderr"
)]

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use nix::{
    sys::signal::{Signal, killpg},
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
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
    // A worker frozen after the handler started may thaw past the lease's stop: the
    // job may run elsewhere by now. (`relayq work`'s guard process makes the same
    // check with the machine's clock after the fork; here the window between this
    // check and the fork stays open.)
    if let Some(d) = JobContext::current().and_then(|c| c.deadline())
        && tokio::time::Instant::now() >= d.stop_at
    {
        return Err(JobError::retryable(
            "the lease's deadline passed before the command could start",
        ));
    }
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("LC_ALL", "C")
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
