//! The worker handler: decode the command from the payload, run it, report what
//! happened, and turn a failure into a `JobError` carrying the command's output.

use std::{sync::Arc, time::Duration};

use relayq_core::{
    ClaimedJob, JobId,
    progress::MAX_RESULT_BYTES,
    settle::MAX_ERROR_BYTES,
    worker::{Done, Handler, JobContext, JobError},
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::{
    exec::{Ending, Execution, execute},
    output::last_bytes,
    spec::CommandSpec,
};

/// What a handler reports as jobs start and end, for progress displays.
#[derive(Debug, Clone)]
pub struct JobEvent {
    /// The job's queue.
    pub queue: String,
    /// The job.
    pub job: JobId,
    /// Its display name.
    pub name: String,
    /// Its stage, if in a batch.
    pub stage: Option<i32>,
    /// The attempt number.
    pub attempt: u32,
    /// Attempts it gets in all.
    pub max_attempts: u16,
    /// What happened.
    pub kind: EventKind,
}

/// A job started or ended.
#[derive(Debug, Clone)]
pub enum EventKind {
    /// The command is starting.
    Started {
        /// The command line.
        command: String,
    },
    /// The command ended.
    Ended {
        /// How.
        ending: Ending,
        /// After how long.
        elapsed: Duration,
    },
    /// The payload was not a command.
    BadPayload {
        /// Why.
        error: String,
    },
}

/// Runs jobs whose payload is a [`CommandSpec`].
#[derive(Debug, Clone)]
pub struct CommandHandler {
    events: Option<UnboundedSender<JobEvent>>,
    stop: CancellationToken,
}

impl CommandHandler {
    /// A handler sending its events to `events`; cancelling `stop` kills every running
    /// command.
    pub fn new(events: Option<UnboundedSender<JobEvent>>, stop: CancellationToken) -> Self {
        Self { events, stop }
    }

    /// Runs one job.
    ///
    /// # Errors
    /// A permanent `JobError` when the payload is not a command; a retryable one when the
    /// command fails (non-zero exit, signal, timeout, could not start), with its output.
    pub async fn handle(&self, job: ClaimedJob) -> Result<Done, JobError> {
        let event = |name: String, kind| JobEvent {
            queue: job.lease.queue.clone(),
            job: job.id(),
            name,
            stage: job.stage,
            attempt: job.attempt(),
            max_attempts: job.max_attempts,
            kind,
        };
        let spec = match CommandSpec::from_payload(&job.payload) {
            Ok(spec) => spec,
            Err(e) => {
                let error = format!("payload is not a relayq command: {e}");
                self.send(event(
                    "?".into(),
                    EventKind::BadPayload {
                        error: error.clone(),
                    },
                ));
                return Err(JobError::permanent(error));
            }
        };
        let name = spec.display_name();
        self.send(event(
            name.clone(),
            EventKind::Started {
                command: spec.command.clone(),
            },
        ));
        // The job's lease deadlines go to the command's guard, which kills the command
        // if they pass unrenewed (a frozen worker) or the worker dies.
        let context = JobContext::current();
        let lease = context.as_ref().map(JobContext::deadlines);
        // The parser keeps reports within bounds, so none is refused.
        let report = |percent, message| {
            if let Some(c) = &context {
                let _ = c.progress(percent, message);
            }
        };
        let run = execute(&spec, &self.stop, lease, &report).await;
        self.send(event(
            name,
            EventKind::Ended {
                ending: run.ending.clone(),
                elapsed: run.elapsed,
            },
        ));
        if run.ending.success() {
            Ok(Done {
                output: result_text(&run),
            })
        } else {
            Err(JobError::retryable(failure_text(&run)))
        }
    }

    fn send(&self, event: JobEvent) {
        if let Some(tx) = &self.events {
            // A display that stopped listening is no reason to fail the job.
            let _ = tx.send(event);
        }
    }

    /// This handler in the form the core `Worker` takes.
    pub fn into_worker_handler(self) -> impl Handler {
        let this = Arc::new(self);
        move |job: ClaimedJob| {
            let this = this.clone();
            async move { this.handle(job).await }
        }
    }
}

/// A worker name for the execution log: `ROLE@HOST:PID`.
pub fn worker_name(role: &str) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned());
    let name = format!("{role}@{host}:{}", std::process::id());
    // Keep it a valid label (at most 255 bytes, no control characters).
    crate::spec::shorten(&name, 200).replace(char::is_control, "?")
}

/// The result of a successful run (SPEC L8): the last lines of its output that fit
/// the bound. Once the output had to be cut, a line cut at the front is dropped, unless
/// it is the only one (its end is kept then); `None` without output.
pub fn result_text(run: &Execution) -> Option<String> {
    let output = run.output.text();
    if output.is_empty() {
        return None;
    }
    let kept = last_bytes(&output, MAX_RESULT_BYTES);
    let before = &output[..output.len() - kept.len()];
    // Cut inside a line: what came before (kept or dropped) does not end one.
    let mid_line = if before.is_empty() {
        !run.output.starts_a_line()
    } else {
        !before.ends_with('\n')
    };
    let kept = match kept.split_once('\n') {
        Some((_, rest)) if mid_line && !rest.is_empty() => rest,
        _ => kept,
    };
    Some(kept.to_owned())
}

/// The error text of a failed run: how it ended on the first line, then the tail of its
/// output, cut so the whole fits the error text the core keeps.
pub fn failure_text(run: &Execution) -> String {
    let head = run.ending.to_string();
    let output = run.output.text();
    if output.is_empty() {
        return format!("{head}\n(no output)");
    }
    let dropped = run.output.dropped();
    let intro = if dropped > 0 {
        format!("{head}\n--- output (last part; {dropped} earlier bytes dropped) ---\n")
    } else {
        format!("{head}\n--- output ---\n")
    };
    let room = MAX_ERROR_BYTES.saturating_sub(intro.len());
    format!("{intro}{}", last_bytes(&output, room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{OUTPUT_LIMIT, Tail};

    #[test]
    fn failure_text_starts_with_the_ending_and_fits_the_core_limit() {
        let mut output = Tail::new(OUTPUT_LIMIT);
        output.push("x".repeat(OUTPUT_LIMIT + 10).as_bytes());
        let run = Execution {
            ending: Ending::Exited(3),
            output,
            elapsed: Duration::from_millis(5),
        };
        let text = failure_text(&run);
        assert!(text.starts_with(
            "exit status 3\n--- output (last part; 10 earlier bytes dropped) ---\nxxx"
        ));
        assert!(text.len() <= MAX_ERROR_BYTES);
        assert!(text.ends_with('x'));
    }

    #[test]
    fn result_text_keeps_whole_last_lines_within_the_bound() {
        let run = |bytes: &[u8]| {
            let mut output = Tail::new(OUTPUT_LIMIT);
            output.push(bytes);
            Execution {
                ending: Ending::Exited(0),
                output,
                elapsed: Duration::from_millis(5),
            }
        };
        assert_eq!(result_text(&run(b"")), None);
        assert_eq!(result_text(&run(b"a\nb\n")).as_deref(), Some("a\nb\n"));
        // A cut line at the front is dropped.
        let long = format!("{}\nlast line\n", "x".repeat(OUTPUT_LIMIT));
        // A cut that falls on a line's start keeps that line.
        let exact = format!("{}\n{}", "x".repeat(9), "y\n".repeat(MAX_RESULT_BYTES / 2));
        let kept = result_text(&run(exact.as_bytes())).unwrap();
        assert_eq!(kept.len(), MAX_RESULT_BYTES);
        assert!(kept.starts_with("y\n"));
        assert_eq!(
            result_text(&run(long.as_bytes())).as_deref(),
            Some("last line\n")
        );
        // Invalid bytes grow when replaced; the result still fits.
        let invalid = [0xffu8; OUTPUT_LIMIT];
        let text = result_text(&run(&invalid)).unwrap();
        assert!(text.len() <= MAX_RESULT_BYTES, "{}", text.len());
    }

    #[test]
    fn failure_text_without_output_says_so() {
        let run = Execution {
            ending: Ending::TimedOut(Duration::from_secs(2)),
            output: Tail::new(16),
            elapsed: Duration::from_secs(2),
        };
        assert_eq!(
            failure_text(&run),
            "timed out after 2 s; process group killed\n(no output)"
        );
    }
}
