//! Running one command: `sh -c` in its own process group under a guard process
//! (`guard.rs`), combined output kept bounded, the whole group killed on timeout, on
//! interruption, when the run is dropped, when the worker dies, and when the lease's
//! deadline passes without a renewal.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use relayq_core::worker::LeaseDeadline;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines},
    net::unix::pipe,
    process::Command,
    sync::watch,
};
use tokio_util::sync::CancellationToken;

use command_fds::{CommandFdExt, FdMapping};

use crate::{
    guard::{self, Moment, Order},
    job_progress,
    output::{OUTPUT_LIMIT, Tail},
    spec::CommandSpec,
};

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// It was ended by this signal (not ours).
    Signalled(i32),
    /// It ran past its timeout and was killed.
    TimedOut(Duration),
    /// The run was interrupted (Ctrl-C) and it was killed.
    Interrupted,
    /// It could not be started (bad `cwd`, no `sh`, ...).
    NotStarted(String),
}

impl Ending {
    /// Whether the command succeeded (exit code 0).
    pub fn success(&self) -> bool {
        *self == Self::Exited(0)
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(code) => write!(f, "exit status {code}"),
            Self::Signalled(sig) => write!(f, "killed by signal {sig}"),
            Self::TimedOut(d) => write!(
                f,
                "timed out after {}; process group killed",
                crate::words::duration(*d)
            ),
            Self::Interrupted => f.write_str("interrupted; process group killed"),
            Self::NotStarted(why) => write!(f, "could not start: {why}"),
        }
    }
}

/// What one run of a command produced.
#[derive(Debug, Clone)]
pub struct Execution {
    /// How it ended.
    pub ending: Ending,
    /// The last [`OUTPUT_LIMIT`] bytes of its combined stdout and stderr.
    pub output: Tail,
    /// How long it ran.
    pub elapsed: Duration,
}

/// Kills a process group when dropped, unless told it is gone: the backstop for a
/// guard that ended without killing its command (it was SIGKILLed itself).
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (the group is gone already) is fine.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The worker's end of the pipe to the guard: orders written as they come (a few bytes,
/// a pipe the guard keeps reading, so the blocking write returns at once). Dropped
/// unfinished (the run's future dropped: lease lost, shutdown), it orders `kill`;
/// closed without that (the worker died), the guard stops the command itself.
struct Orders {
    pipe: Option<std::fs::File>,
    finished: bool,
}

impl Orders {
    fn send(&mut self, order: &Order) {
        if let Some(pipe) = &mut self.pipe
            && pipe.write_all(order.line().as_bytes()).is_err()
        {
            // The guard is gone; its report (or its absence) tells the rest.
            self.pipe = None;
        }
    }
}

impl Drop for Orders {
    fn drop(&mut self) {
        if !self.finished {
            self.send(&Order::Kill);
        }
    }
}

/// The guard's orders for `deadline`: SIGTERM at its `stop_at`, SIGKILL half the margin
/// later, so the group is gone before the lease ends.
fn renewal(deadline: Option<LeaseDeadline>) -> Order {
    match deadline {
        Some(d) => Order::Renew {
            term: Some(Moment::of(d.stop_at)),
            grace: d.margin() / 2,
        },
        None => Order::Renew {
            term: None,
            grace: NO_LEASE_GRACE,
        },
    }
}

/// SIGTERM to SIGKILL when the worker dies and no lease sets the grace (`relayq run`
/// outside a worker, tests).
const NO_LEASE_GRACE: Duration = Duration::from_secs(1);

/// The program that runs the guard: this very binary (by `/proc/self/exe`, which
/// still works if the file was replaced by an upgrade). Unit tests run in the test
/// harness, so they use the `relayq` binary cargo built beside it.
fn guard_program() -> PathBuf {
    if cfg!(test) {
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe.parent().and_then(Path::parent).expect("target dir");
        return dir.join("relayq");
    }
    PathBuf::from("/proc/self/exe")
}

/// Runs `spec` to its end. `stop` interrupts it (the group is killed). `lease`, the
/// job's lease deadlines as the worker renews them, is passed on to the command's guard
/// process, which kills the command if the deadline passes with no renewal (a frozen
/// worker) or the worker dies.
///
/// When the shell exits, whatever it left running in its process group is killed too,
/// so a job's processes end with the job and its output pipe closes.
///
/// Each progress line the command writes to its progress descriptor
/// ([`job_progress`]) goes to `progress` as it comes.
pub async fn execute(
    spec: &CommandSpec,
    stop: &CancellationToken,
    lease: Option<watch::Receiver<Option<LeaseDeadline>>>,
    progress: &(dyn Fn(u8, String) + Sync),
) -> Execution {
    let started = Instant::now();
    let mut output = Tail::new(OUTPUT_LIMIT);
    let ending = match run(spec, stop, lease, progress, &mut output).await {
        Ok(ending) => ending,
        Err(e) => Ending::NotStarted(e.to_string()),
    };
    Execution {
        ending,
        output,
        elapsed: started.elapsed(),
    }
}

async fn run(
    spec: &CommandSpec,
    stop: &CancellationToken,
    mut lease: Option<watch::Receiver<Option<LeaseDeadline>>>,
    progress: &(dyn Fn(u8, String) + Sync),
    output: &mut Tail,
) -> std::io::Result<Ending> {
    let (writer, mut reader) = pipe::pipe()?;
    let writer = writer.into_blocking_fd()?;
    // The progress descriptor: the guard gets it as `job_progress::FD` and leaves it
    // open for the shell, as it does every descriptor not marked close-on-exec.
    let (reports_writer, mut reports_reader) = pipe::pipe()?;
    let reports_writer = reports_writer.into_blocking_fd()?;
    let first = renewal(lease.as_mut().and_then(|l| *l.borrow_and_update()));
    let Order::Renew { term, grace } = &first else {
        unreachable!("a renewal")
    };
    let mut cmd = Command::new(guard_program());
    cmd.arg(guard::SUBCOMMAND)
        .arg(guard::term_word(*term))
        .arg(grace.as_millis().to_string())
        .arg(&spec.command)
        .envs(&spec.env)
        .stdin(Stdio::piped())
        .stdout(writer)
        .stderr(Stdio::piped())
        .env(job_progress::ENV, job_progress::FD.to_string())
        // Its own group: the terminal's Ctrl-C and Ctrl-Z, meant for the worker, must
        // not reach the guard. Not killed on drop: a dropped run orders `kill` instead,
        // and the guard must outlive the worker to do its job.
        .process_group(0);
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: reports_writer,
        child_fd: job_progress::FD,
    }])
    .map_err(|_| std::io::Error::other("the progress descriptor collides with another"))?;
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let spawned = cmd.spawn();
    // The command keeps our copies of the pipe's write end until it is dropped; drop it
    // now so the reader sees end-of-file once the job's processes are gone.
    drop(cmd);
    let mut child = spawned?;
    let mut orders = Orders {
        pipe: child
            .stdin
            .take()
            .and_then(|s| s.into_owned_fd().ok())
            .map(std::fs::File::from),
        finished: false,
    };
    // Lines, not `read_line`: the read sits in a `select!` beside the shell's exit, and
    // `Lines::next_line` keeps a partly read line when it loses the race, where
    // `read_line` would drop it (and with it the guard's last report).
    let mut reports = child.stderr.take().map(|e| BufReader::new(e).lines());
    // Until the guard says which group the command has, there is none to kill.
    let mut group = GroupGuard(None);
    let mut report = None;
    let mut lines = job_progress::Lines::default();
    let mut chunk = vec![0u8; 4096];
    let mut reading_progress = true;

    let timeout = spec.timeout();
    let wait = async {
        let sleep = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let mut ours = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                read = next_report(reports.as_mut()) => {
                    match read {
                        Some(l) => match l.strip_prefix("pgid ").and_then(|p| p.parse().ok()) {
                            Some(pgid) => group = GroupGuard(Some(Pid::from_raw(pgid))),
                            None => report = Some(l),
                        },
                        None => reports = None,
                    }
                }
                read = reports_reader.read(&mut chunk), if reading_progress => match read {
                    Ok(n) if n > 0 => {
                        for (percent, message) in lines.push(&chunk[..n]) {
                            progress(percent, message);
                        }
                    }
                    _ => reading_progress = false,
                },
                changed = changed(lease.as_mut()) => match changed {
                    Some(deadline) => orders.send(&renewal(deadline)),
                    None => lease = None,
                },
                () = &mut sleep, if ours.is_none() => {
                    ours = Some(Ending::TimedOut(timeout.unwrap_or_default()));
                    orders.send(&Order::Kill);
                }
                () = stop.cancelled(), if ours.is_none() => {
                    ours = Some(Ending::Interrupted);
                    orders.send(&Order::Kill);
                }
            }
        };
        orders.finished = true;
        // Progress written just before the end and not read yet is in the pipe.
        while reading_progress {
            match reports_reader.try_read(&mut chunk) {
                Ok(n) if n > 0 => {
                    for (percent, message) in lines.push(&chunk[..n]) {
                        progress(percent, message);
                    }
                }
                _ => reading_progress = false,
            }
        }
        // The guard's last report, written before it exited.
        if let Some(r) = reports.as_mut() {
            while let Some(l) = next_report(Some(&mut *r)).await {
                report = Some(l);
            }
        }
        let ending = match (ours, report.as_deref().map(parse_report), status) {
            (Some(ours), _, _) => ours,
            (None, Some(Some(ending)), _) => {
                // The guard killed the group once the shell exited.
                group.0 = None;
                ending
            }
            // No report: the guard itself was killed; its command may run on.
            (None, _, Ok(status)) => {
                group.kill();
                Ending::NotStarted(format!(
                    "the command's guard ended ({status}) without a report; its process group was killed"
                ))
            }
            (None, _, Err(e)) => return Err(e),
        };
        group.kill();
        Ok(ending)
    };
    let read = async {
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => output.push(&chunk[..n]),
            }
        }
    };
    let (ending, ()) = tokio::join!(wait, read);
    ending
}

/// The next line of the guard's reports; never returns once they ended. Cancel-safe.
async fn next_report(
    reports: Option<&mut Lines<BufReader<tokio::process::ChildStderr>>>,
) -> Option<String> {
    let Some(r) = reports else {
        return std::future::pending().await;
    };
    match r.next_line().await {
        Ok(Some(line)) => Some(line.trim_end().to_owned()),
        Ok(None) | Err(_) => None,
    }
}

/// The next lease deadline; `None` once the worker's side is gone. Without a lease,
/// never returns.
async fn changed(
    lease: Option<&mut watch::Receiver<Option<LeaseDeadline>>>,
) -> Option<Option<LeaseDeadline>> {
    let Some(rx) = lease else {
        return std::future::pending().await;
    };
    match rx.changed().await {
        Ok(()) => Some(*rx.borrow_and_update()),
        Err(_) => None,
    }
}

/// How the guard says the command ended: `exit N`, `signal N`, `error TEXT`.
fn parse_report(line: &str) -> Option<Ending> {
    let (kind, rest) = line.split_once(' ')?;
    match kind {
        "exit" => rest.parse().ok().map(Ending::Exited),
        "signal" => rest.parse().ok().map(Ending::Signalled),
        "error" => Some(Ending::NotStarted(rest.to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exec(spec: CommandSpec) -> Execution {
        execute(&spec, &CancellationToken::new(), None, &|_, _| {}).await
    }

    #[tokio::test]
    async fn keeps_stdout_and_stderr_and_the_exit_code() {
        let run = exec(CommandSpec::new("echo out; echo err >&2; exit 3")).await;
        assert_eq!(run.ending, Ending::Exited(3));
        assert_eq!(run.output.text(), "out\nerr\n");
    }

    #[tokio::test]
    async fn progress_lines_on_the_named_descriptor_are_reported() {
        let seen = std::sync::Mutex::new(Vec::new());
        let report = |p, m| seen.lock().unwrap().push((p, m));
        let spec = CommandSpec::new(
            "echo 'relayq-progress 40 copying table x' >&\"$RELAYQ_PROGRESS_FD\"; \
             echo 'not progress' >&3; echo out; echo 'relayq-progress 100' >&3",
        );
        let run = execute(&spec, &CancellationToken::new(), None, &report).await;
        assert!(
            run.ending.success(),
            "{:?}: {}",
            run.ending,
            run.output.text()
        );
        assert_eq!(run.output.text(), "out\n");
        assert_eq!(
            *seen.lock().unwrap(),
            [(40, "copying table x".to_owned()), (100, String::new())]
        );
    }

    #[tokio::test]
    async fn passes_env_and_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = CommandSpec::new("echo \"$GREETING\"; pwd");
        spec.env.insert("GREETING".into(), "hello there".into());
        spec.cwd = Some(dir.path().display().to_string());
        let run = exec(spec).await;
        assert!(run.ending.success(), "{:?}", run.ending);
        let real = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(
            run.output.text(),
            format!("hello there\n{}\n", real.display())
        );
    }

    /// Whether process `pid` has ended (gone, or a zombie waiting to be reaped).
    fn ended(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        // A background grandchild prints its pid; the shell then outlives the timeout.
        let mut spec = CommandSpec::new("sleep 30 & echo $!; sleep 30");
        spec.timeout_ms = Some(200);
        let run = exec(spec).await;
        assert_eq!(run.ending, Ending::TimedOut(Duration::from_millis(200)));
        assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
        let text = run.output.text();
        let pid = text.trim();
        assert!(pid.parse::<u32>().is_ok(), "output {text:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ended(pid) {
            assert!(
                Instant::now() < deadline,
                "grandchild {pid} outlived the timeout"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn output_is_bounded_to_the_last_64_kib() {
        let run = exec(CommandSpec::new(
            "head -c 100000 /dev/zero | tr '\\0' a; echo END",
        ))
        .await;
        assert!(run.ending.success());
        let text = run.output.text();
        assert_eq!(text.len(), OUTPUT_LIMIT);
        assert!(text.ends_with("aEND\n"));
        assert_eq!(run.output.dropped(), 100_004 - OUTPUT_LIMIT as u64);
    }

    #[tokio::test]
    async fn a_missing_cwd_is_reported_as_not_started() {
        let mut spec = CommandSpec::new("true");
        spec.cwd = Some("/definitely/not/here".into());
        let run = exec(spec).await;
        assert!(
            matches!(run.ending, Ending::NotStarted(_)),
            "{:?}",
            run.ending
        );
    }

    /// A worker frozen between reckoning the lease's deadline and starting the guard
    /// thaws with the deadline past: the guard reads the machine's clock and does not
    /// start the command, which could otherwise run beside the job's next attempt.
    #[tokio::test]
    async fn a_deadline_past_before_the_guard_starts_is_never_started() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let spec = CommandSpec::new(format!("touch {}", marker.display()));
        let now = tokio::time::Instant::now();
        let (_renewals, lease) = watch::channel(Some(LeaseDeadline {
            stop_at: now - Duration::from_millis(10),
            lease_ends: now + Duration::from_millis(490),
        }));
        let run = execute(&spec, &CancellationToken::new(), Some(lease), &|_, _| {}).await;
        assert!(
            matches!(&run.ending, Ending::NotStarted(e) if e.contains("deadline passed")),
            "{:?}",
            run.ending
        );
        assert!(!marker.exists(), "the command ran");
    }

    #[tokio::test]
    async fn stop_interrupts() {
        let stop = CancellationToken::new();
        let spec = CommandSpec::new("sleep 30");
        let (run, ()) = tokio::join!(execute(&spec, &stop, None, &|_, _| {}), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
        assert_eq!(run.ending, Ending::Interrupted);
    }
}
