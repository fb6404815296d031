//! Running one command: `sh -c` in its own process group, combined output kept bounded,
//! the whole group killed on timeout, on interruption, or when the run is dropped.

use std::{
    os::unix::process::ExitStatusExt,
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio::{io::AsyncReadExt, net::unix::pipe, process::Command};
use tokio_util::sync::CancellationToken;

use crate::{
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
                humantime::format_duration(*d)
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

/// Kills a process group when dropped, unless it was killed already: no command outlives
/// the job that started it, even when the job's task is aborted.
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

/// Runs `spec` to its end. `stop` interrupts it (the group is killed).
///
/// When the shell exits, whatever it left running in its process group is killed too,
/// so a job's processes end with the job and its output pipe closes.
pub async fn execute(spec: &CommandSpec, stop: &CancellationToken) -> Execution {
    let started = Instant::now();
    let mut output = Tail::new(OUTPUT_LIMIT);
    let ending = match run(spec, stop, &mut output).await {
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
    output: &mut Tail,
) -> std::io::Result<Ending> {
    let (writer, mut reader) = pipe::pipe()?;
    let writer = writer.into_blocking_fd()?;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(&spec.command)
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let spawned = cmd.spawn();
    // The command keeps our copies of the pipe's write end until it is dropped; drop it
    // now so the reader sees end-of-file once the job's processes are gone.
    drop(cmd);
    let mut child = spawned?;
    let mut group = GroupGuard(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    );

    let timeout = spec.timeout();
    let wait = async {
        let sleep = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let ending = tokio::select! {
            status = child.wait() => status.map(ending_of),
            () = sleep => Ok(Ending::TimedOut(timeout.unwrap_or_default())),
            () = stop.cancelled() => Ok(Ending::Interrupted),
        };
        // Kill what is left of the group (everything, on timeout or interruption), so
        // the pipe closes; then reap the shell.
        group.kill();
        let _ = child.wait().await;
        ending
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

fn ending_of(status: ExitStatus) -> Ending {
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Exited(code),
        (None, Some(sig)) => Ending::Signalled(sig),
        (None, None) => Ending::Exited(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exec(spec: CommandSpec) -> Execution {
        execute(&spec, &CancellationToken::new()).await
    }

    #[tokio::test]
    async fn keeps_stdout_and_stderr_and_the_exit_code() {
        let run = exec(CommandSpec::new("echo out; echo err >&2; exit 3")).await;
        assert_eq!(run.ending, Ending::Exited(3));
        assert_eq!(run.output.text(), "out\nerr\n");
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

    #[tokio::test]
    async fn stop_interrupts() {
        let stop = CancellationToken::new();
        let spec = CommandSpec::new("sleep 30");
        let (run, ()) = tokio::join!(execute(&spec, &stop), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
        assert_eq!(run.ending, Ending::Interrupted);
    }
}
