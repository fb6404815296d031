//! One run on one backend: servers up, jobs in, workers and faults, drain, check.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use futures::StreamExt;
use nix::sys::signal::Signal;
use relayq::{Backend, Batch, JobId, JobState, OnFailure};
use tokio::sync::watch;

use crate::{
    check::{self, Check, Observed, Report},
    feed,
    ledger::Ledger,
    plan::{JOB_SCRIPT, Plan},
    servers::{Cluster, Fsync, Postgres, RedisNode},
    slots, stops,
    workers::{WorkerConfig, Workers},
};

/// The queue every job goes to: `torture` on the servers a run starts itself, a fresh
/// name on a server it is given ([`Kind::Given`]), where earlier runs' jobs may be.
pub fn queue() -> &'static str {
    QUEUE.get().map_or("torture", String::as_str)
}

static QUEUE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes [`queue`] a fresh name, for the rest of the process.
pub fn fresh_queue() {
    let _ = QUEUE.set(format!("torture-{:08x}", fastrand::u32(..)));
}

/// Which backend a run tortures.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A SQLite file.
    Sqlite,
    /// Its own PostgreSQL.
    Postgres,
    /// Its own Redis, with this `appendfsync`.
    Redis(Fsync),
    /// Its own 3-node Redis Cluster (`appendfsync always` on each node).
    Cluster,
    /// Any other backend with a server, at the URL its driver's test variable gives:
    /// worker faults only (kills, stops, and every worker killed at once in place of a
    /// server crash), as the run cannot restart a server it did not start.
    Given(&'static relayq::Driver),
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite => f.write_str("sqlite"),
            Self::Postgres => f.write_str("postgres"),
            Self::Redis(fsync) => write!(f, "redis (appendfsync {})", fsync.word()),
            Self::Cluster => f.write_str("redis-cluster"),
            Self::Given(driver) => write!(f, "{} (given server)", driver.name),
        }
    }
}

/// How many faults of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    /// SIGKILLs of a worker process (restarted after a pause).
    pub kills: u32,
    /// SIGSTOPs of a worker process past its lease, then SIGCONT.
    pub stops: u32,
    /// Clean server restarts (`pg_ctl -m fast`, Redis `SHUTDOWN`; a cluster node).
    pub clean_restarts: u32,
    /// Crash restarts (`pg_ctl -m immediate`, SIGKILL of redis-server, SIGKILL of the
    /// cluster node holding the queue; on SQLite, SIGKILL of every worker at once).
    pub crash_restarts: u32,
    /// Connection kills (`pg_terminate_backend`, `CLIENT KILL TYPE normal`).
    pub conn_kills: u32,
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The backend.
    pub kind: Kind,
    /// The seed of the job mix and of the fault schedule.
    pub seed: u64,
    /// How many jobs.
    pub jobs: usize,
    /// Worker processes.
    pub processes: usize,
    /// Slots per process.
    pub concurrency: u32,
    /// Each job's lease.
    pub lease: Duration,
    /// The faults.
    pub faults: FaultCounts,
    /// The longest delay of a delayed job.
    pub max_delay: Duration,
    /// When to give up waiting for the jobs to finish (they are then reported stuck).
    pub deadline: Duration,
    /// The `relayq` binary.
    pub relayq: PathBuf,
    /// The library worker binary (`relayq-torture-worker`), run in every fourth
    /// process slot; `None`: `relayq work` in every slot.
    pub library: Option<PathBuf>,
    /// Keep the temporary folder (it is kept anyway when a check fails).
    pub keep: bool,
}

/// One fault, as scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL a worker; restart it after `pause_ms`.
    Kill {
        /// Slot.
        worker: usize,
        /// Before the restart.
        pause_ms: u64,
    },
    /// SIGSTOP a worker past its lease, then SIGCONT.
    Stop {
        /// Slot.
        worker: usize,
    },
    /// A clean server restart.
    CleanRestart,
    /// A crash restart, the server down `down_ms` before it starts again.
    CrashRestart {
        /// Down time.
        down_ms: u64,
    },
    /// Kill the server's client connections.
    ConnKill,
    /// Cancel the planned cancel targets.
    Cancel,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Self::Kill { .. } => "SIGKILL worker",
            Self::Stop { .. } => "SIGSTOP worker past lease",
            Self::CleanRestart => "clean restart",
            Self::CrashRestart { .. } => "crash restart",
            Self::ConnKill => "connection kill",
            Self::Cancel => "cancels",
        }
    }
}

/// The seeded schedule: each fault fires when this share of the jobs has finished.
#[must_use]
pub fn schedule(settings: &Settings) -> Vec<(u32, Fault)> {
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0x5eed_fa17);
    let f = settings.faults;
    let n = settings.processes.max(1);
    let mut out = Vec::new();
    // Per mille of jobs finished, in 20..=800.
    let at = |rng: &mut fastrand::Rng| rng.u32(20..=800);
    for _ in 0..f.kills {
        let fault = Fault::Kill {
            worker: rng.usize(0..n),
            pause_ms: rng.u64(100..=1000),
        };
        out.push((at(&mut rng), fault));
    }
    for _ in 0..f.stops {
        let fault = Fault::Stop {
            worker: rng.usize(0..n),
        };
        out.push((at(&mut rng), fault));
    }
    let server = !matches!(settings.kind, Kind::Sqlite | Kind::Given(_));
    if server {
        for _ in 0..f.clean_restarts {
            out.push((at(&mut rng), Fault::CleanRestart));
        }
        for _ in 0..f.conn_kills {
            out.push((at(&mut rng), Fault::ConnKill));
        }
    }
    for _ in 0..f.crash_restarts {
        let fault = Fault::CrashRestart {
            down_ms: rng.u64(0..=1500),
        };
        out.push((at(&mut rng), fault));
    }
    out.push((rng.u32(100..=500), Fault::Cancel));
    out.sort();
    out
}

/// The servers of a run.
enum Target {
    Sqlite(PathBuf),
    Postgres(Postgres),
    Redis(RedisNode),
    Cluster(Cluster),
    Given(String),
}

impl Target {
    fn start(kind: Kind, dir: &Path) -> anyhow::Result<Self> {
        Ok(match kind {
            Kind::Sqlite => Self::Sqlite(dir.join("torture.db")),
            Kind::Postgres => Self::Postgres(Postgres::start(dir)?),
            Kind::Redis(fsync) => Self::Redis(RedisNode::start(dir.join("redis"), fsync, false)?),
            Kind::Cluster => Self::Cluster(Cluster::start(dir)?),
            Kind::Given(driver) => {
                let server = driver
                    .server
                    .context("the backend has no server: nothing to give")?;
                let url = server
                    .open_url()
                    .with_context(|| format!("{} is unset", server.env_var))?;
                Self::Given(url)
            }
        })
    }

    fn url(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(pg) => pg.url(),
            Self::Redis(r) => format!("redis://127.0.0.1:{}", r.port),
            Self::Cluster(c) => c.url(),
            Self::Given(url) => url.clone(),
        }
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(_) | Self::Given(_) => Ok(()),
            Self::Postgres(pg) => pg.stop(),
            Self::Redis(r) => r.halt(false),
            Self::Cluster(c) => c.nodes.iter_mut().try_for_each(|n| n.halt(false)),
        }
    }
}

/// What a fault did, for the log.
type Done = anyhow::Result<String>;

fn inject(
    fault: Fault,
    target: &mut Target,
    workers: &mut Workers,
    lease: Duration,
    rng: &mut fastrand::Rng,
    conts: &mut Vec<(Instant, usize)>,
) -> Done {
    match (fault, target) {
        (Fault::Kill { worker, pause_ms }, _) => {
            workers.sigkill(worker)?;
            std::thread::sleep(Duration::from_millis(pause_ms));
            workers.spawn(worker)?;
            Ok(format!(
                "worker {worker} killed, restarted after {pause_ms} ms"
            ))
        }
        (Fault::Stop { worker }, _) => {
            let for_ = lease + Duration::from_secs(1);
            workers.signal(worker, Signal::SIGSTOP)?;
            conts.push((Instant::now() + for_, worker));
            // The SIGCONT comes from a thread of its own, on time: the main loop may be
            // waiting on the database (a cancel, a count), and a worker stopped while it
            // held SQLite's write lock makes it wait until that worker runs again.
            if let Some(pid) = workers.pid(worker) {
                std::thread::spawn(move || {
                    std::thread::sleep(for_);
                    let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
                });
            }
            Ok(format!(
                "worker {worker} stopped for {for_:?} (SIGCONT then)"
            ))
        }
        (Fault::CrashRestart { .. }, Target::Sqlite(_) | Target::Given(_)) => {
            for w in 0..workers.len() {
                workers.sigkill(w)?;
            }
            for w in 0..workers.len() {
                workers.spawn(w)?;
            }
            Ok("every worker killed at once, restarted".into())
        }
        (Fault::CleanRestart, Target::Postgres(pg)) => {
            pg.restart(false).map(|()| "pg_ctl -m fast".into())
        }
        (Fault::CrashRestart { down_ms }, Target::Postgres(pg)) => pg
            .restart(true)
            .map(|()| format!("pg_ctl -m immediate (restarted at once; {down_ms} ms asked)")),
        (Fault::ConnKill, Target::Postgres(pg)) => pg
            .kill_connections()
            .map(|n| format!("{n} connections terminated")),
        (Fault::CleanRestart, Target::Redis(r)) => {
            r.restart(false).map(|()| "SHUTDOWN, restarted".into())
        }
        (Fault::CrashRestart { down_ms }, Target::Redis(r)) => {
            r.halt(true)?;
            std::thread::sleep(Duration::from_millis(down_ms));
            r.restart(false)?;
            Ok(format!(
                "SIGKILL, down {down_ms} ms, restarted from the AOF"
            ))
        }
        (Fault::ConnKill, Target::Redis(r)) => r
            .kill_connections()
            .map(|n| format!("{n} connections killed")),
        (Fault::CleanRestart, Target::Cluster(c)) => {
            let i = rng.usize(0..c.nodes.len());
            c.nodes[i].restart(false)?;
            c.wait_ok()?;
            Ok(format!("node {i} SHUTDOWN, restarted"))
        }
        (Fault::CrashRestart { down_ms }, Target::Cluster(c)) => {
            let i = c.busiest();
            c.nodes[i].halt(true)?;
            std::thread::sleep(Duration::from_millis(down_ms));
            c.nodes[i].restart(false)?;
            c.wait_ok()?;
            Ok(format!(
                "node {i} (the queue's) SIGKILL, down {down_ms} ms, restarted from its AOF"
            ))
        }
        (Fault::ConnKill, Target::Cluster(c)) => {
            let mut n = 0;
            for node in &c.nodes {
                n += node.kill_connections()?;
            }
            Ok(format!("{n} connections killed on 3 nodes"))
        }
        (Fault::Cancel, _) => unreachable!("cancels are made by the run"),
        (Fault::CleanRestart | Fault::ConnKill, Target::Sqlite(_) | Target::Given(_)) => {
            Ok("n/a".into())
        }
    }
}

/// Retries `f` on transient errors for up to 60 s (the server may be restarting).
pub(crate) async fn retry<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = relayq::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| what.to_owned()),
        }
    }
}

/// The batches opened, and what went in before the workers started: ids of the early
/// jobs and the answers of the second enqueue of each dedupe key.
struct Early {
    batches: Vec<Batch>,
    ids: Vec<Option<JobId>>,
    dedupe: BTreeMap<usize, (JobId, bool)>,
}

/// Opens the plan's batches and enqueues its early jobs (see [`feed::split`]) in calls
/// of 200, then the dedupe keys a second time.
async fn enqueue_early(
    backend: &Arc<dyn Backend>,
    plan: &Plan,
    dir: &str,
    early: &[usize],
) -> anyhow::Result<Early> {
    let mut batches: Vec<Batch> = Vec::new();
    for b in &plan.batches {
        let on = if b.halt {
            OnFailure::Halt
        } else {
            OnFailure::Continue
        };
        batches.push(backend.open_batch(queue(), on).await?);
    }
    let mut ids = vec![None; plan.jobs.len()];
    for chunk in early.chunks(200) {
        // A parent is an earlier early job: stored by an earlier call, or in this one.
        let parent = |p: usize| {
            ids[p]
                .map(relayq::After::Job)
                .or_else(|| chunk.iter().position(|&c| c == p).map(relayq::After::Call))
        };
        let got = backend
            .enqueue(
                chunk
                    .iter()
                    .map(|&i| feed::new_job(plan, dir, &batches, i, false, None, &parent))
                    .collect(),
            )
            .await
            .context("enqueue")?;
        for (&i, e) in chunk.iter().zip(got) {
            ids[i] = Some(e.id);
        }
    }
    let mut dedupe = BTreeMap::new();
    let dups: Vec<usize> = early
        .iter()
        .copied()
        .filter(|&i| plan.jobs[i].dedupe)
        .collect();
    if !dups.is_empty() {
        let got = backend
            .enqueue(
                dups.iter()
                    .map(|&i| feed::new_job(plan, dir, &batches, i, false, None, &|_| None))
                    .collect(),
            )
            .await
            .context("second enqueue of the dedupe keys")?;
        for (&i, e) in dups.iter().zip(got) {
            dedupe.insert(i, (e.id, e.deduplicated));
        }
    }
    Ok(Early {
        batches,
        ids,
        dedupe,
    })
}

/// The outcome of one run.
pub struct Outcome {
    /// What ran.
    pub kind: Kind,
    /// The checks.
    pub report: Report,
    /// The faults injected, per kind.
    pub faults: BTreeMap<&'static str, u32>,
    /// Wall time of the workload (workers start to last job finished).
    pub elapsed: Duration,
    /// The temporary folder, when kept.
    pub kept: Option<PathBuf>,
}

fn say(kind: Kind, t0: Instant, what: &str) {
    eprintln!("[{kind} {:7.2}s] {what}", t0.elapsed().as_secs_f64());
}

/// Runs one backend.
///
/// # Errors
/// A server or worker that cannot start, an enqueue that fails: the run could not
/// take place (violations are in the [`Outcome`], not errors).
#[allow(clippy::too_many_lines, reason = "the run's steps in order")]
pub async fn run(s: &Settings) -> anyhow::Result<Outcome> {
    let t0 = Instant::now();
    if !s.relayq.exists() {
        bail!(
            "no relayq binary at {}: build it first (cargo build -p relayq-cli) or pass --relayq",
            s.relayq.display()
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("relayq-torture.")
        .tempdir()
        .context("temporary folder")?;
    let dir = tmp.path().to_path_buf();
    for sub in ["locks", "marks", "logs"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::write(dir.join("job.sh"), JOB_SCRIPT)?;
    std::fs::write(dir.join("ledger"), "")?;
    let dir_s = dir
        .to_str()
        .context("temporary folder path is not UTF-8")?
        .to_owned();
    say(s.kind, t0, &format!("folder {dir_s}"));

    let mut target = Target::start(s.kind, &dir)?;
    let url = target.url();
    say(s.kind, t0, &format!("server up: {url}"));
    let backend = relayq::connect(&url).await.context("connect")?;
    let mut plan = Plan::generate(s.seed, s.jobs, u64::try_from(s.max_delay.as_millis())?);
    if backend.limits().limit_keys {
        for &(key, limit) in crate::plan::KEY_LIMITS {
            backend
                .set_key_limit(queue(), Some(key), Some(limit))
                .await
                .context("set the plan's key limits")?;
        }
    } else {
        plan = plan.without_limit_keys();
    }
    if !backend.limits().dependencies {
        plan = plan.without_after();
    }
    let plan = Arc::new(plan);
    let split = feed::split(&plan);
    let Early {
        batches,
        mut ids,
        dedupe,
    } = enqueue_early(&backend, &plan, &dir_s, &split.early).await?;
    say(
        s.kind,
        t0,
        &format!(
            "{} jobs enqueued; {} more to come in {} calls while the workers run",
            split.early.len(),
            plan.jobs.len() - split.early.len(),
            split.late.len()
        ),
    );

    let cell = slots::start(&*backend).await?;
    let rate_cell = crate::rates::start(&*backend).await?;
    let key_rate_cell = crate::key_rates::start(&*backend).await?;
    let mut stops = stops::Cell::new(dir.clone(), s.lease);
    let mut workers = Workers::start(
        WorkerConfig {
            exe: s.relayq.clone(),
            db: url.clone(),
            queue: queue().into(),
            extra_queues: vec![
                cell.queue.clone(),
                stops.queue().to_owned(),
                rate_cell.queue.clone(),
                key_rate_cell.queue.clone(),
            ],
            concurrency: s.concurrency,
            lease: s.lease,
            dir: dir.join("logs"),
            library: s.library.clone(),
        },
        s.processes,
    )?;
    let embedded = matches!(s.kind, Kind::Sqlite);
    let mut skewed = cell.start_skewed(&s.relayq, &url, &dir.join("logs"), embedded)?;
    let started = Instant::now();
    let (finished_tx, finished_rx) = watch::channel(0_u64);
    // The producer keeps about a quarter of the plan enqueued and unfinished.
    let window = (plan.jobs.len() as u64 / 4).max(100);
    let producer = feed::Producer {
        backend: backend.clone(),
        plan: plan.clone(),
        dir: dir_s.clone(),
        batches: Arc::new(batches),
        late: split.late.clone(),
        window,
        early_ids: Arc::new(ids.clone()),
    };
    let mut producer = Some(tokio::spawn(
        producer.run(finished_rx, split.early.len() as u64),
    ));
    let mut produced = None;
    let sched = schedule(s);
    let mut next = 0;
    let mut rng = fastrand::Rng::with_seed(s.seed ^ 0xc105);
    let mut faults: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut cancels = BTreeMap::new();
    let mut total = plan.jobs.len() as u64;
    let mut last_tenth = 0;
    // Stopped workers and when they get their SIGCONT.
    let mut conts: Vec<(Instant, usize)> = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = Instant::now();
        for &(_, w) in conts.iter().filter(|(at, _)| *at <= now) {
            workers.signal(w, Signal::SIGCONT)?;
        }
        conts.retain(|(at, _)| *at > now);
        for (i, status) in workers.exited() {
            say(
                s.kind,
                t0,
                &format!("worker {i} ended by itself ({status}); restarted"),
            );
            workers.spawn(i)?;
        }
        let Ok(stats) = backend.queue_stats(queue()).await else {
            continue;
        };
        let finished: u64 = [JobState::Succeeded, JobState::Dead, JobState::Cancelled]
            .iter()
            .map(|&st| stats.count(st))
            .sum();
        let _ = finished_tx.send(finished);
        if producer
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
            && let Some(p) = producer.take()
        {
            let p = p.await.context("the producer panicked")??;
            say(
                s.kind,
                t0,
                &format!(
                    "producer done: {} late jobs stored, {} refused by a halted batch, {} batches sealed, {} calls retried",
                    p.ids.len(),
                    p.refused.len(),
                    p.sealed,
                    p.retried
                ),
            );
            for &(i, id) in &p.ids {
                ids[i] = Some(id);
            }
            total -= p.refused.len() as u64;
            produced = Some(p);
        }
        let per_mille = u32::try_from(finished * 1000 / total.max(1)).unwrap_or(1000);
        let line = format!("{finished}/{total} finished");
        if per_mille / 100 != last_tenth {
            last_tenth = per_mille / 100;
            say(s.kind, t0, &line);
        }
        while next < sched.len() && sched[next].0 <= per_mille {
            let fault = sched[next].1;
            next += 1;
            *faults.entry(fault.label()).or_default() += 1;
            if fault == Fault::Cancel {
                stops.fire(backend.clone())?;
                let targets = (0..plan.jobs.len()).filter(|&i| plan.jobs[i].cancel);
                for i in targets {
                    let Some(id) = ids[i] else { continue };
                    let r = retry("cancel", || backend.cancel_job(queue(), id)).await;
                    cancels.insert(i, r.ok());
                }
                say(
                    s.kind,
                    t0,
                    &format!("{} jobs cancelled (asked)", cancels.len()),
                );
                continue;
            }
            let what = tokio::task::block_in_place(|| {
                inject(
                    fault,
                    &mut target,
                    &mut workers,
                    s.lease,
                    &mut rng,
                    &mut conts,
                )
            })
            .with_context(|| format!("fault {fault:?}"))?;
            say(s.kind, t0, &format!("fault {}: {what}", fault.label()));
        }
        if next == sched.len()
            && produced.is_some()
            && finished == total
            && conts.is_empty()
            && rate_cell.finished(&*backend).await.unwrap_or(false)
            && key_rate_cell.finished(&*backend).await.unwrap_or(false)
        {
            break;
        }
        if started.elapsed() > s.deadline {
            say(
                s.kind,
                t0,
                &format!("deadline of {:?} passed: {line}", s.deadline),
            );
            break;
        }
    }
    let elapsed = started.elapsed();
    if let Some(p) = producer.take() {
        p.abort();
        say(
            s.kind,
            t0,
            "the producer had not finished; late jobs not enqueued are lost",
        );
    }
    let produced = produced.unwrap_or_default();
    say(
        s.kind,
        t0,
        &format!("workload done in {elapsed:.1?}; stopping workers"),
    );
    let stopping = cell.stopping(&*backend).await?;
    let killed = tokio::task::block_in_place(|| workers.stop_all(Duration::from_secs(20)))?;
    tokio::task::block_in_place(|| skewed.stop());
    if !killed.is_empty() {
        say(
            s.kind,
            t0,
            &format!("workers {killed:?} did not stop on SIGTERM; killed"),
        );
    }
    // SPEC W4 and `relayq work --shutdown-timeout 5s`: a worker stops within seconds.
    let stopped = Check {
        name: "workers stop on SIGTERM",
        checked: workers.len(),
        violations: killed
            .iter()
            .map(|w| {
                format!(
                    "worker {w} still ran 20 s after SIGTERM (--shutdown-timeout 5s); SIGKILLed"
                )
            })
            .collect(),
        excused: Vec::new(),
    };

    let stats = retry("queue_stats", || backend.queue_stats(queue())).await?;
    let jobs: Vec<Option<relayq::JobInfo>> = futures::stream::iter(ids.iter().copied())
        .map(|id| {
            let backend = backend.clone();
            async move {
                match id {
                    None => Ok(None),
                    Some(id) => match retry("job", || backend.job(queue(), id)).await {
                        Ok(j) => Ok(Some(j)),
                        Err(e)
                            if e.downcast_ref::<relayq::Error>()
                                .is_some_and(|e| matches!(e, relayq::Error::NotFound { .. })) =>
                        {
                            Ok(None)
                        }
                        Err(e) => Err(e),
                    },
                }
            }
        })
        .buffered(16)
        .collect::<Vec<anyhow::Result<_>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let ledger = Ledger::parse(&std::fs::read_to_string(dir.join("ledger"))?);
    let obs = Observed {
        ids,
        refused: produced.refused.iter().copied().collect(),
        dedupe,
        cancels,
        jobs,
        stats,
    };
    // PostgreSQL commits claims asynchronously: a crash may forget one (its doc); its
    // times are transaction starts.
    let allow = check::Allowances {
        lost_claims: matches!(s.kind, Kind::Postgres) && s.faults.crash_restarts > 0,
        // PostgreSQL's now() and SQL Server's batch-start @now are transaction starts.
        tx_start_times: match s.kind {
            Kind::Postgres => true,
            Kind::Given(driver) => matches!(driver.name, "postgres" | "mssql"),
            _ => false,
        },
    };
    let mut report = check::check(&plan, &obs, &ledger, allow);
    report.checks.push(stopped);
    report.checks.push(cell.check(&*backend, stopping).await?);
    let (stopped_cell, note) = stops.check(&*backend).await?;
    report.checks.push(stopped_cell);
    report.figures.push(("live-cancel cell".into(), note));
    let (rated, note) = rate_cell.check(&*backend).await?;
    report.checks.push(rated);
    report.figures.push(("rate cell".into(), note));
    let (key_rated, note) = key_rate_cell.check(&*backend).await?;
    report.checks.push(key_rated);
    report
        .checks
        .push(key_rate_cell.check_backlog(&*backend).await?);
    report.figures.push(("key-rate cell".into(), note));
    report.figures.push((
        "schedule cell's skewed scheduler".into(),
        skewed.note.clone(),
    ));
    if s.library.is_some() {
        report.checks.push(library_took_part(&obs));
    }
    drop(backend);
    if let Target::Sqlite(path) = &target {
        match integrity(path) {
            Ok(c) => report.checks.push(c),
            Err(e) => report
                .figures
                .push(("sqlite integrity_check".into(), format!("not run: {e}"))),
        }
    }
    tokio::task::block_in_place(|| target.stop())?;
    report.figures.push((
        "worker processes started".into(),
        workers.started.to_string(),
    ));
    report.figures.push((
        "jobs enqueued during the run".into(),
        format!(
            "{}; calls retried {}, jobs found stored on a retry {}, refused by a halted batch {}, batches sealed {}",
            produced.ids.len(),
            produced.retried,
            produced.found_stored,
            produced.refused.len(),
            produced.sealed
        ),
    ));
    let kept = if report.violations() > 0 || s.keep {
        Some(tmp.keep())
    } else {
        None
    };
    Ok(Outcome {
        kind: s.kind,
        report,
        faults,
        elapsed,
        kept,
    })
}

/// The library worker's slots must have run attempts: a run in which they never
/// claimed anything tested `relayq work` alone.
fn library_took_part(obs: &Observed) -> Check {
    let attempts = obs
        .jobs
        .iter()
        .flatten()
        .flat_map(|j| &j.attempt_log)
        .filter(|a| a.worker.starts_with("lib"))
        .count();
    let mut c = Check {
        name: "library worker ran jobs",
        checked: attempts,
        violations: Vec::new(),
        excused: Vec::new(),
    };
    if attempts == 0 {
        c.violations
            .push("no attempt by a library worker in the execution log".into());
    }
    c
}

/// `PRAGMA integrity_check` through the `sqlite3` shell; an error when it cannot run.
fn integrity(path: &Path) -> Result<Check, String> {
    let out = std::process::Command::new("sqlite3")
        .args(["-cmd", ".timeout 10000"])
        .arg(path)
        .arg("PRAGMA integrity_check")
        .output()
        .map_err(|e| format!("sqlite3: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut c = Check {
        name: "sqlite integrity_check",
        checked: 1,
        violations: Vec::new(),
        excused: Vec::new(),
    };
    if text.trim() != "ok" {
        c.violations.push(format!(
            "integrity_check: {}{}",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(c)
}
