//! The `relayq work` processes of a run.

use std::{
    fs::OpenOptions,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Settings of every worker process.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The `relayq` binary.
    pub exe: PathBuf,
    /// `--db`.
    pub db: String,
    /// `--queue`.
    pub queue: String,
    /// More `--queue`s for the `relayq work` processes: the schedule cell's and the
    /// live-cancel cell's.
    pub extra_queues: Vec<String>,
    /// `--concurrency`.
    pub concurrency: u32,
    /// `--lease`.
    pub lease: Duration,
    /// Where their output goes (`worker-N.log`, appended over restarts).
    pub dir: PathBuf,
    /// The library worker (`relayq-torture-worker`), run in every fourth slot (3, 7,
    /// ...) when set; `relayq work` in the others.
    pub library: Option<PathBuf>,
}

impl WorkerConfig {
    /// Whether slot `i` runs the library worker.
    #[must_use]
    pub fn is_library(&self, i: usize) -> bool {
        self.library.is_some() && i % 4 == 3
    }
}

/// The worker processes, by slot.
#[derive(Debug)]
pub struct Workers {
    config: WorkerConfig,
    procs: Vec<Option<Child>>,
    /// Processes started in all, restarts included.
    pub started: usize,
}

impl Workers {
    /// Starts `n` workers.
    ///
    /// # Errors
    /// When one cannot start.
    pub fn start(config: WorkerConfig, n: usize) -> anyhow::Result<Self> {
        let mut w = Self {
            config,
            procs: (0..n).map(|_| None).collect(),
            started: 0,
        };
        for i in 0..n {
            w.spawn(i)?;
        }
        Ok(w)
    }

    /// How many slots.
    #[must_use]
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Starts slot `i`'s process (after its previous one ended).
    ///
    /// # Errors
    /// When it cannot start.
    pub fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let c = &self.config;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(c.dir.join(format!("worker-{i}.log")))?;
        let mut cmd = match &c.library {
            Some(lib) if c.is_library(i) => {
                let mut cmd = Command::new(lib);
                cmd.arg(&c.db)
                    .arg(&c.queue)
                    .arg(c.concurrency.to_string())
                    .arg(c.lease.as_millis().to_string())
                    .arg(format!("lib{i}.{}", self.started));
                cmd
            }
            _ => {
                let mut cmd = Command::new(&c.exe);
                cmd.arg("--db")
                    .arg(&c.db)
                    .arg("work")
                    .args(["--queue", &c.queue])
                    .args(c.extra_queues.iter().flat_map(|q| ["--queue", q.as_str()]))
                    .args(["--concurrency", &c.concurrency.to_string()])
                    .args(["--lease", &format!("{}ms", c.lease.as_millis())])
                    .args(["--shutdown-timeout", "5s"])
                    .args(["--name", &format!("w{i}.{}", self.started)]);
                cmd
            }
        };
        let exe = cmd.get_program().to_owned();
        let child = cmd
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.to_string_lossy()))?;
        self.procs[i] = Some(child);
        self.started += 1;
        Ok(())
    }

    pub(crate) fn pid(&self, i: usize) -> Option<Pid> {
        self.procs[i]
            .as_ref()
            .map(|c| Pid::from_raw(i32::try_from(c.id()).expect("pids fit in i32")))
    }

    /// SIGKILL of slot `i`'s process, reaped.
    ///
    /// # Errors
    /// When it cannot be signalled.
    pub fn sigkill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(pid) = self.pid(i) {
            let _ = kill(pid, Signal::SIGCONT);
            kill(pid, Signal::SIGKILL)?;
        }
        if let Some(mut c) = self.procs[i].take() {
            c.wait()?;
        }
        Ok(())
    }

    /// SIGSTOP or SIGCONT to slot `i`'s process.
    ///
    /// # Errors
    /// When it cannot be signalled.
    pub fn signal(&self, i: usize, sig: Signal) -> anyhow::Result<()> {
        if let Some(pid) = self.pid(i) {
            kill(pid, sig)?;
        }
        Ok(())
    }

    /// Slots whose process ended by itself (not by our SIGKILL), with its status.
    pub fn exited(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            if let Some(c) = p
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push((i, status.to_string()));
                *p = None;
            }
        }
        out
    }

    /// SIGCONT, then SIGTERM to every process; waits up to `limit` for them to end
    /// (SIGKILL after). Returns the slots that had to be killed.
    ///
    /// # Errors
    /// When a process cannot be signalled.
    pub fn stop_all(&mut self, limit: Duration) -> anyhow::Result<Vec<usize>> {
        for i in 0..self.procs.len() {
            if let Some(pid) = self.pid(i) {
                let _ = kill(pid, Signal::SIGCONT);
                let _ = kill(pid, Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + limit;
        let mut killed = Vec::new();
        for i in 0..self.procs.len() {
            let Some(mut c) = self.procs[i].take() else {
                continue;
            };
            loop {
                if c.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    c.wait()?;
                    killed.push(i);
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(killed)
    }

    /// The log folder.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
