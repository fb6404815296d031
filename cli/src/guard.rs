//! `relayq __guard`: the process that owns one job's command and makes sure it never
//! outlives its worker nor its lease: once the lease ends, the job may run elsewhere.
//!
//! A process of its own, because what it guards against is the worker process itself
//! being killed (SIGKILL, OOM) or frozen (SIGSTOP, Ctrl-Z, a paused VM): no thread or
//! task of the worker runs then. The guard runs the command with `sh -c` in a new
//! process group and sits in a process group of its own too, so the terminal's Ctrl-C
//! and Ctrl-Z reach neither.
//!
//! Its stdin is a pipe from the worker carrying renewals of the lease's deadline (the
//! worker forwards each heartbeat that got through). The guard kills the command's
//! whole group:
//! - at once (SIGKILL) when the worker says `kill` (timeout, Ctrl-C, lease lost, or
//!   the run dropped), and when the shell exits (whatever it left running goes too);
//! - with SIGTERM, then SIGKILL after a grace, when the pipe closes without a `kill`
//!   (the worker died: the kernel closed its end) or when the deadline passes with no
//!   renewal (the worker is frozen, or its heartbeats do not get through). The worker
//!   sets deadline and grace so that the SIGKILL falls before the lease ends, so the
//!   group is gone before the job can be claimed again.
//!
//! Its stdout is the job's output pipe, handed to the command as stdout and stderr;
//! its stderr carries reports to the worker, one per line: `pgid N` once the command
//! started, then one of `exit N`, `signal N`, `error TEXT`.
//!
//! What it does not cover: the guard itself being SIGKILLed (the worker then kills the
//! group itself when it sees the guard end without a report, if it is alive), and a
//! command that leaves its process group (`setsid`) escapes every group kill.

use std::{
    io::{BufRead, Write},
    os::{
        fd::AsFd,
        unix::process::{CommandExt, ExitStatusExt},
    },
    process::{Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

/// The hidden subcommand's name: `relayq __guard TERM_AT GRACE_MS COMMAND`.
pub const SUBCOMMAND: &str = "__guard";

/// A moment on `CLOCK_MONOTONIC`, which every process of the machine reads alike and
/// which runs on while a process is stopped. Orders carry moments, not durations from
/// now: a worker frozen (SIGSTOP) after reckoning its deadline and before the guard
/// started, or before an order went out, would otherwise hand on a deadline that had
/// passed as one still seconds away, and the command would start or run on beside the
/// job's next attempt (found by the torture's 100,000-job run on Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(Duration);

impl Moment {
    /// Now.
    #[must_use]
    pub fn now() -> Self {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .expect("CLOCK_MONOTONIC is always there on Linux");
        Self(Duration::from(t))
    }

    /// `at` as a moment. The clock is read before `Instant::now()`, so a freeze
    /// between the two readings moves the moment earlier, never later.
    #[must_use]
    pub fn of(at: tokio::time::Instant) -> Self {
        let mono = Self::now();
        let now = tokio::time::Instant::now();
        if at >= now {
            Self(mono.0 + (at - now))
        } else {
            Self(mono.0.saturating_sub(now - at))
        }
    }

    /// Where this moment falls on `Instant`'s scale (the past becomes now).
    fn instant(self) -> Instant {
        let now = Instant::now();
        now + self.0.saturating_sub(Self::now().0)
    }
}

/// `TERM_AT` as the guard's argument and its orders write it: milliseconds on the
/// clock, or `-` for no deadline.
#[must_use]
pub fn term_word(term: Option<Moment>) -> String {
    term.map_or_else(|| "-".to_owned(), |t| t.0.as_millis().to_string())
}

/// A message on the guard's stdin: the lease renewed, or kill now.
#[derive(Debug, PartialEq, Eq)]
pub enum Order {
    /// Stop the command at `term` (SIGTERM), then SIGKILL `grace` later.
    Renew {
        /// When to send SIGTERM; `None` for no deadline.
        term: Option<Moment>,
        /// From SIGTERM to SIGKILL.
        grace: Duration,
    },
    /// SIGKILL the group now.
    Kill,
}

impl Order {
    /// The line for the pipe.
    pub fn line(&self) -> String {
        match self {
            Self::Renew { term, grace } => {
                format!("renew {} {}\n", term_word(*term), grace.as_millis())
            }
            Self::Kill => "kill\n".to_owned(),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        match words.next()? {
            "kill" => Some(Self::Kill),
            "renew" => {
                let term = words.next()?;
                let term = if term == "-" {
                    None
                } else {
                    Some(Moment(Duration::from_millis(term.parse().ok()?)))
                };
                let grace = Duration::from_millis(words.next()?.parse().ok()?);
                Some(Self::Renew { term, grace })
            }
            _ => None,
        }
    }
}

enum Event {
    Order(Order),
    /// The worker's end of the pipe closed.
    Gone,
    Exited(std::io::Result<ExitStatus>),
}

/// Runs the guard with the arguments after `__guard`; returns the exit code.
pub fn main(args: &[String]) -> u8 {
    let mut report = std::io::stderr().lock();
    let [term, grace, command] = args else {
        let _ = writeln!(
            report,
            "error usage: relayq {SUBCOMMAND} TERM_AT GRACE_MS COMMAND"
        );
        return 2;
    };
    let Some(Order::Renew { term, grace }) = Order::parse(&format!("renew {term} {grace}")) else {
        let _ = writeln!(report, "error bad deadline {term:?} {grace:?}");
        return 2;
    };
    let output = |what| {
        std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map(Stdio::from)
            .map_err(|e| format!("cannot pass on {what}: {e}"))
    };
    let (stdout, stderr) = match (output("stdout"), output("stderr")) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            let _ = writeln!(report, "error {e}");
            return 1;
        }
    };
    // Frozen between reckoning the deadline and starting this guard, the worker may
    // have let the lease run out: the job may be running elsewhere already.
    if term.is_some_and(|t| t <= Moment::now()) {
        let _ = writeln!(
            report,
            "error the lease's deadline passed before the command could start (was the worker frozen?); not started"
        );
        return 1;
    }
    let spawned = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(report, "error {e}");
            return 1;
        }
    };
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let _ = report.write_all(format!("pgid {pgid}\n").as_bytes());
    let (tx, rx) = mpsc::channel();
    let orders = tx.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Some(order) = Order::parse(&line) {
                let _ = orders.send(Event::Order(order));
            }
        }
        let _ = orders.send(Event::Gone);
    });
    std::thread::spawn(move || {
        let _ = tx.send(Event::Exited(child.wait()));
    });
    let status = watch(&rx, pgid, term.map(Moment::instant), grace);
    // Whatever the shell left running in its group goes with it.
    let _ = killpg(pgid, Signal::SIGKILL);
    let line = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            (None, None) => "exit -1".to_owned(),
        },
        Err(e) => format!("error waiting for the command: {e}"),
    };
    // One write: a reader must never see half a report.
    let _ = report.write_all(format!("{line}\n").as_bytes());
    0
}

/// Follows orders and deadlines until the shell exits; returns its status.
fn watch(
    rx: &mpsc::Receiver<Event>,
    pgid: Pid,
    mut term_at: Option<Instant>,
    mut grace: Duration,
) -> std::io::Result<ExitStatus> {
    // Set once SIGTERM went: then SIGKILL is due at `kill_at`.
    let mut kill_at: Option<Instant> = None;
    let mut gone = false;
    loop {
        let now = Instant::now();
        if kill_at.is_none() && term_at.is_some_and(|t| now >= t) {
            let _ = killpg(pgid, Signal::SIGTERM);
            kill_at = Some(now + grace);
        }
        if kill_at.is_some_and(|t| now >= t) {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let next = kill_at.or(term_at);
        let event = match next {
            // Past a SIGKILL already sent: just wait for the shell to be reaped.
            Some(t) if t <= now => rx.recv().ok(),
            Some(t) => match rx.recv_timeout(t - now) {
                Ok(ev) => Some(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
            None => rx.recv().ok(),
        };
        match event {
            Some(Event::Exited(status)) => return status,
            Some(Event::Order(Order::Kill)) => {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            // A renewal before SIGTERM went moves the deadline; after, the command is
            // stopping and it changes nothing.
            Some(Event::Order(Order::Renew { term, grace: g })) if kill_at.is_none() => {
                term_at = term.map(Moment::instant);
                grace = g;
            }
            Some(Event::Gone) if !gone => {
                // The worker died: stop now, within the deadline's kill time if sooner.
                gone = true;
                if kill_at.is_none() {
                    let _ = killpg(pgid, Signal::SIGTERM);
                    let by_grace = Instant::now() + grace;
                    let by_deadline = term_at.map(|t| t + grace);
                    kill_at = Some(by_deadline.map_or(by_grace, |d| d.min(by_grace)));
                }
            }
            // A renewal after SIGTERM went, or a second end of the pipe: nothing to do.
            Some(Event::Order(Order::Renew { .. }) | Event::Gone) => {}
            // Both threads gone without an exit: cannot happen; kill and stop.
            None => {
                let _ = killpg(pgid, Signal::SIGKILL);
                return Err(std::io::Error::other("lost track of the command"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_trip_through_their_lines() {
        for order in [
            Order::Kill,
            Order::Renew {
                term: Some(Moment(Duration::from_millis(123_456_789))),
                grace: Duration::from_millis(250),
            },
            Order::Renew {
                term: None,
                grace: Duration::from_secs(1),
            },
        ] {
            assert_eq!(Order::parse(order.line().trim_end()), Some(order));
        }
        assert_eq!(Order::parse("renew x 1"), None);
        assert_eq!(Order::parse("renew -5 1"), None);
        assert_eq!(Order::parse("what"), None);
    }

    #[test]
    fn moments_keep_their_place_on_the_instant_scale() {
        let at = tokio::time::Instant::now() + Duration::from_secs(5);
        let moment = Moment::of(at);
        let left = moment.instant().saturating_duration_since(Instant::now());
        assert!(
            left <= Duration::from_secs(5) && left > Duration::from_secs(4),
            "{left:?}"
        );
        // A moment past is now, not a wrap-around.
        let past = Moment::of(tokio::time::Instant::now() - Duration::from_secs(1));
        assert!(past < Moment::now());
        assert!(past.instant() <= Instant::now());
    }
}
