//! The worker runtime, generic over backends (SPEC W1–W5).
//!
//! A [`Worker`] serves one or more queues with a fixed number of slots
//! (`concurrency`):
//! - it claims up to its free slots in one call, taking queues in turn so a busy queue
//!   cannot starve another (W1, W5);
//! - runs each job's handler on one of its slots' tasks, while one keeper task heartbeats
//!   every started job's lease (every lease/3 by default) until its outcome is stored
//!   or given up on; a handler whose lease is lost (revoked, taken over, or about to
//!   run out with no heartbeat getting through) is stopped, so it never runs beside
//!   the job's next attempt (W1);
//! - a handler error fails the job (retryable unless permanent; a retry time the
//!   backends would refuse falls back to the default backoff), a panic fails it with
//!   the panic text, a handler past its timeout is failed (W3);
//! - hands outcomes to a settler that acknowledges many in one `settle_many` call,
//!   flushed after a few milliseconds, when enough wait, or at once when the worker
//!   has run dry (W1); a call refused as a whole is settled again one outcome at a
//!   time, so one bad outcome costs only its own job;
//! - claims again as soon as a slot frees; when idle it waits for the backend's
//!   events, and polls with bounded backoff (at most 1 s by default) as a fallback (W2);
//! - optionally ([`WorkerBuilder::prefetch`]) claims ahead of its free slots into a
//!   local buffer, so short jobs do not wait a round trip for each claim;
//! - runs the maintenance pass over its queues on a timer, skipping a queue whose pass
//!   another worker holds ([`WorkerBuilder::maintenance`], SPEC M3);
//! - on shutdown stops claiming, lets running handlers finish until a deadline, then
//!   releases what is left (W4).

mod beat;
mod buffer;
mod context;
mod control;
mod handler;
mod job;
mod keeper;
mod maintainer;
mod outage;
mod pace;
mod progress;
mod revoke;
mod run;
mod scheduler;
mod settler;
mod slot;
mod slots;
mod stats;

use std::{sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use context::{JobContext, LeaseDeadline};
pub use handler::{Done, Handler, JobError};
pub use revoke::DEFAULT_CANCEL_POLL;
pub use stats::{Kind as MetricKind, METRICS, WorkerReport, describe_metrics};

use crate::{Backend, Error, Result, validate};

/// How often a worker runs the maintenance pass by default.
pub const DEFAULT_MAINTENANCE_EVERY: Duration = Duration::from_secs(60);

/// Settings of a worker; see the [`WorkerBuilder`] setters for defaults.
#[derive(Debug, Clone)]
struct Config {
    name: String,
    concurrency: u32,
    /// `None`: automatic (see `pace`).
    prefetch: Option<u32>,
    lease: Duration,
    heartbeat: Option<Duration>,
    timeout: Option<Duration>,
    shutdown_timeout: Duration,
    settle_batch: usize,
    settle_delay: Duration,
    poll_min: Duration,
    poll_max: Duration,
    /// `None`: no maintenance timer.
    maintenance: Option<maintainer::Schedule>,
    /// Whether the worker fires its queues' schedules.
    schedules: bool,
    /// How often running leases are read for cancels where they are not pushed.
    cancel_poll: Duration,
    /// The largest result a handler may leave (SPEC L8).
    max_result: usize,
}

/// A worker: build it with [`Worker::builder`], then [`run`](Worker::run) or
/// [`spawn`](Worker::spawn) it.
pub struct Worker {
    backend: Arc<dyn Backend>,
    queues: Vec<String>,
    handler: Arc<dyn Handler>,
    config: Config,
}

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    backend: Arc<dyn Backend>,
    queues: Vec<String>,
    handler: Option<Arc<dyn Handler>>,
    config: Config,
    /// Unset: the backend's [`preferred_settle_batch`](crate::Complete::preferred_settle_batch).
    settle_batch: Option<usize>,
}

impl Worker {
    /// A builder for a worker serving `queues` from `backend`.
    pub fn builder<I, S>(backend: Arc<dyn Backend>, queues: I) -> WorkerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        WorkerBuilder {
            backend,
            queues: queues.into_iter().map(Into::into).collect(),
            handler: None,
            settle_batch: None,
            config: Config {
                name: format!("worker-{}-{:04x}", std::process::id(), fastrand::u16(..)),
                concurrency: 8,
                prefetch: None,
                lease: Duration::from_secs(30),
                heartbeat: None,
                timeout: None,
                shutdown_timeout: Duration::from_secs(30),
                // Set by `build`: this builder's `settle_batch`, or the backend's.
                settle_batch: crate::DEFAULT_SETTLE_BATCH,
                settle_delay: Duration::from_millis(2),
                poll_min: Duration::from_millis(10),
                poll_max: Duration::from_secs(1),
                maintenance: Some(maintainer::Schedule {
                    every: DEFAULT_MAINTENANCE_EVERY,
                    retention: crate::DEFAULT_RETENTION,
                }),
                schedules: true,
                cancel_poll: revoke::DEFAULT_CANCEL_POLL,
                max_result: crate::progress::MAX_RESULT_BYTES,
            },
        }
    }

    /// The worker's name, as recorded in the execution log.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// How many outcomes it settles in one call at most: its builder's `settle_batch`,
    /// or else its backend's
    /// [`preferred_settle_batch`](crate::Complete::preferred_settle_batch) kept within
    /// 1..=1000.
    #[must_use]
    pub fn settle_batch(&self) -> usize {
        self.config.settle_batch
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully (SPEC W4).
    ///
    /// # Errors
    /// None today; the result leaves room for fatal setup errors of future backends.
    /// Backend errors while running are logged and retried, never fatal.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport> {
        run::Runner::new(self).run(shutdown).await
    }

    /// Runs on a new task; the returned handle stops it.
    #[must_use]
    pub fn spawn(self) -> RunningWorker {
        let token = CancellationToken::new();
        let task = tokio::spawn(self.run(token.clone()));
        RunningWorker { token, task }
    }
}

/// A worker running on its own task.
#[derive(Debug)]
pub struct RunningWorker {
    token: CancellationToken,
    task: JoinHandle<Result<WorkerReport>>,
}

impl RunningWorker {
    /// Shuts the worker down gracefully and waits for it (SPEC W4).
    ///
    /// # Errors
    /// [`Error::Backend`] if the worker task itself panicked.
    pub async fn shutdown(self) -> Result<WorkerReport> {
        self.token.cancel();
        self.task.await.map_err(Error::backend)?
    }
}

impl WorkerBuilder {
    /// The handler every job runs (required).
    #[must_use]
    pub fn handler(mut self, handler: impl Handler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// The worker's name in the execution log. Default `worker-<pid>-<random>`.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// How many jobs run at once (1..=1000). Default 8.
    #[must_use]
    pub fn concurrency(mut self, n: u32) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Claims up to `n` jobs beyond the free slots into a local buffer (0..=1000);
    /// 0 claims only for free slots, as SPEC W1 describes.
    ///
    /// Default: automatic. The worker holds ahead as many jobs as its slots take in
    /// four claim round trips or 25 ms, whichever is longer, measured as it runs, at
    /// most 256: none for long jobs (with 16 slots, jobs longer than 0.4 s; more slots
    /// take more jobs a second), and up to 256 for short ones, whether claims are
    /// fast (fewer, larger claims leave the server and the worker more time for jobs)
    /// or slow (a server whose claim index is full of dead rows, for instance). Set a
    /// number to fix it, 0 to turn it off.
    ///
    /// With short jobs a worker otherwise spends a claim round trip per handful of
    /// jobs; a buffer lets freed slots start the next job at once while claims (up to
    /// two at a time) top it up in the background. For a queue of short jobs a few
    /// hundred is a good start (the benchmark runs with 256, `docs/BENCHMARKS.md`).
    /// Larger claims cost a SQL server less per job (each claim carries a fixed cost of
    /// planning and round trips): on PostgreSQL, 1,000 drained 15–20% faster than 256,
    /// at the price of one worker holding more of the queue. Leave it at 0 for long
    /// jobs, or where several workers should share a small queue evenly.
    ///
    /// # Behavior
    /// - Buffered jobs are leased: no other worker can take them, they count under the
    ///   queue's `max_running`, and a buffered group head holds its group.
    /// - A job waits in the buffer for at most one heartbeat interval; then it is
    ///   released (`ready` again, attempt not counted) so its lease never expires
    ///   unrenewed.
    /// - The buffer is refilled ahead of free slots only while jobs leave it for
    ///   slots: a worker whose slots stay busy claims nothing more. With long jobs,
    ///   each freed slot still claims up to `n` ahead, and what no slot takes within a
    ///   heartbeat interval goes back; keep prefetch for short jobs.
    /// - On shutdown every buffered job is released (SPEC W4).
    /// - Jobs start in the order their claims started, so `(priority, run_at, id)`
    ///   order holds within one worker; across workers a buffered job may start after
    ///   a later one elsewhere.
    #[must_use]
    pub fn prefetch(mut self, n: u32) -> Self {
        self.config.prefetch = Some(n);
        self
    }

    /// Lease length of each claim, renewed by heartbeats. Default 30 s.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Heartbeat interval. Default lease / 3.
    ///
    /// A handler whose heartbeats stop getting through (they fail, or hang) is stopped
    /// shortly before its lease would run out (by half the shorter of the interval and
    /// what the lease leaves after it), so it never runs beside the job's next attempt;
    /// one whose outcome is already with the settler is left to the server's verdict.
    ///
    /// # What holds, and what does not
    /// "Stopped" means: the handler's future is dropped at its next `.await`, and its
    /// [`JobContext::stopping`] token fires, at [`LeaseDeadline::stop_at`] (or at once
    /// when a beat finds the lease lost). That promise has limits a handler must know:
    /// - Work outside the future is not stopped by the drop: a thread, a task it
    ///   spawned, a child process. Stop it when the token fires, or by
    ///   [`JobContext::deadline`] at the latest; otherwise it can run beside the next
    ///   attempt.
    /// - A handler that blocks its thread is stopped only when it yields.
    /// - All of this needs the worker process running. A worker that is killed
    ///   (SIGKILL, OOM) or frozen (SIGSTOP, Ctrl-Z, a VM paused) neither drops futures
    ///   nor fires tokens: its in-process work dies or freezes with it (and so cannot
    ///   run beside the next attempt), but child processes run on. Such work needs a
    ///   watcher outside the process, as `relayq work` gives every shell command: a
    ///   guard process that kills the command's process group when the worker's pipe
    ///   closes or the deadline passes without a renewal.
    /// - A frozen worker that thaws after its lease ran out stops the handler when its
    ///   keeper's overdue timer fires; if the handler returned first, its outcome is
    ///   sent and the server refuses it when the job was taken over (SPEC L1).
    #[must_use]
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.config.heartbeat = Some(every);
        self
    }

    /// Fails a handler still running after `timeout` (SPEC W3). Default none.
    ///
    /// The handler is stopped at an `.await`: one that blocks its thread runs on until it
    /// yields or returns, and is failed then, even if it returned `Ok`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// How long shutdown lets running handlers finish before releasing them. Default
    /// 30 s. Like [`timeout`](Self::timeout), the release happens at an `.await`: a
    /// handler that blocks its thread holds shutdown up until it yields or returns.
    ///
    /// The server work around it is bounded too: handing back claimed jobs before, and
    /// storing the outcomes after, get at most this long each. A server that stops
    /// answering thus delays the end of [`run`](Worker::run) by about three times this
    /// at most; outcomes not stored by then count as `lost` in the report, and their
    /// jobs run again once their leases end.
    #[must_use]
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.config.shutdown_timeout = d;
        self
    }

    /// Settle in one call once this many outcomes wait (1..=1000). Default: the
    /// backend's [`preferred_settle_batch`](crate::Complete::preferred_settle_batch),
    /// 128 unless it says otherwise (PostgreSQL and SQLite prefer 512: each of their
    /// calls is a transaction with a commit).
    #[must_use]
    pub fn settle_batch(mut self, n: usize) -> Self {
        self.settle_batch = Some(n);
        self
    }

    /// Longest an outcome waits for others before it is settled. Default 2 ms.
    ///
    /// # Behavior
    /// - Outcomes wait for company only while more may come: once the worker has run
    ///   dry (no job running or buffered, and its last claim came back short) what
    ///   waits is settled at once. Those outcomes may be what the queue waits for: a
    ///   group's next job, a batch's next stage, a caller's `wait`.
    /// - So a worker fed jobs more slowly than it runs them settles after every
    ///   claim: at most one settle call more per claim than the delay alone makes.
    #[must_use]
    pub fn settle_delay(mut self, d: Duration) -> Self {
        self.config.settle_delay = d;
        self
    }

    /// Shortest idle poll interval. Default 10 ms.
    #[must_use]
    pub fn poll_min(mut self, d: Duration) -> Self {
        self.config.poll_min = d;
        self
    }

    /// Longest idle poll interval, the fallback when no event arrives (SPEC W2).
    /// Default 1 s.
    #[must_use]
    pub fn poll_max(mut self, d: Duration) -> Self {
        self.config.poll_max = d;
        self
    }

    /// Runs the maintenance pass (SPEC M3) over each served queue every `every`
    /// (±10%), deleting finished jobs that finished more than `retention` ago and
    /// recovering expired leases. Default: on, every 60 s, retention 7 days
    /// ([`DEFAULT_RETENTION`](crate::DEFAULT_RETENTION)).
    ///
    /// # Behavior
    /// - Of the workers serving a queue, one runs a pass at a time: each calls
    ///   [`try_maintain`](crate::Admin::try_maintain), which skips while another's pass
    ///   holds the backend's lock.
    /// - The first pass comes after a random part of `every`; a failed pass is tried at
    ///   the next tick (a warning is logged unless the server is down).
    /// - Unfinished jobs are never pruned.
    #[must_use]
    pub fn maintenance(mut self, every: Duration, retention: Duration) -> Self {
        self.config.maintenance = Some(maintainer::Schedule { every, retention });
        self
    }

    /// Turns the maintenance timer off: for programs that run
    /// [`maintain`](crate::Admin::maintain) themselves (a cron job, `relayq prune`).
    #[must_use]
    pub fn no_maintenance(mut self) -> Self {
        self.config.maintenance = None;
        self
    }

    /// Stops the worker firing its queues' schedules (SPEC S5), which it does by
    /// default: about once a second, or at the next slot when that is sooner. Any
    /// number of workers may fire a schedule; each slot is enqueued once.
    #[must_use]
    pub fn no_schedules(mut self) -> Self {
        self.config.schedules = false;
        self
    }

    /// How often the worker reads its running jobs' leases to learn of cancels, on a
    /// backend that cannot push them to every process (SQLite, SQL Server; see
    /// [`Events::pushes_revocations`](crate::Events::pushes_revocations)). Default 50 ms,
    /// so a cancel stops the handler within about that (SPEC B8). The read happens only
    /// while the worker runs jobs, and is one indexed read of their rows.
    #[must_use]
    pub fn cancel_poll(mut self, every: Duration) -> Self {
        self.config.cancel_poll = every;
        self
    }

    /// The largest result a handler may leave on success, in bytes: 1 to 64 KiB, the
    /// default 64 KiB (SPEC L8). A handler that leaves a longer one fails, for good,
    /// with an error naming `result`.
    #[must_use]
    pub fn max_result(mut self, bytes: usize) -> Self {
        self.config.max_result = bytes;
        self
    }

    /// Checks the settings and builds the worker.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad setting: no queue or a bad queue name
    /// (`queues`/`queue`), `concurrency` outside 1..=1000, a bad `lease`, `heartbeat` not
    /// shorter than the lease, `settle_batch` or `prefetch` out of range, a `maintenance`
    /// interval or a `cancel_poll` of zero, a `max_result` outside 1..=64 KiB, a bad
    /// `name`, or no `handler`.
    pub fn build(self) -> Result<Worker> {
        let c = &self.config;
        if self.queues.is_empty() {
            return Err(Error::invalid(
                "queues",
                "a worker needs at least one queue",
            ));
        }
        for q in &self.queues {
            validate::queue_name(q)?;
        }
        validate::label("name", &c.name)?;
        if !(1..=1000).contains(&c.concurrency) {
            return Err(Error::invalid(
                "concurrency",
                format!("must be 1..=1000, got {}", c.concurrency),
            ));
        }
        if let Some(n) = c.prefetch
            && n > validate::MAX_CLAIM_LIMIT
        {
            return Err(Error::invalid(
                "prefetch",
                format!("must be 0..=1000, got {n}"),
            ));
        }
        validate::lease_length("lease", c.lease)?;
        if c.heartbeat.is_some_and(|h| h.is_zero() || h >= c.lease) {
            return Err(Error::invalid(
                "heartbeat",
                "must be above zero and shorter than the lease",
            ));
        }
        if self
            .settle_batch
            .is_some_and(|n| !(1..=validate::MAX_SETTLE).contains(&n))
        {
            return Err(Error::invalid("settle_batch", "must be 1..=1000"));
        }
        if c.poll_min.is_zero() || c.poll_min > c.poll_max {
            return Err(Error::invalid(
                "poll_min",
                "must be above zero and at most poll_max",
            ));
        }
        if c.maintenance.is_some_and(|m| m.every.is_zero()) {
            return Err(Error::invalid(
                "maintenance",
                "the interval must be above zero",
            ));
        }
        if c.cancel_poll.is_zero() {
            return Err(Error::invalid("cancel_poll", "must be above zero"));
        }
        if !(1..=crate::progress::MAX_RESULT_BYTES).contains(&c.max_result) {
            return Err(Error::invalid(
                "max_result",
                format!(
                    "must be 1..={}, got {}",
                    crate::progress::MAX_RESULT_BYTES,
                    c.max_result
                ),
            ));
        }
        if c.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid("timeout", "must be above zero"));
        }
        let handler = self
            .handler
            .ok_or_else(|| Error::invalid("handler", "a worker needs a handler"))?;
        let mut config = self.config;
        config.settle_batch = self
            .settle_batch
            .unwrap_or_else(|| self.backend.preferred_settle_batch())
            .clamp(1, validate::MAX_SETTLE);
        Ok(Worker {
            // Every claim, settle and heartbeat in a span of its own (crate::traced).
            backend: Arc::new(crate::Traced::new(self.backend)),
            queues: self.queues,
            handler,
            config,
        })
    }
}
