//! `relayq enqueue -- COMMAND...`: store one command as a job.
use std::time::Duration;

use relayq_core::{BatchId, EnqueueExt, Error as CoreError, NewJob};

use crate::{
    args::{QueueArg, duration, positive_duration},
    backend::{self, Use},
    connect,
    exit::{self, usage},
    handler::worker_name,
    spec::CommandSpec,
};

/// Arguments of `relayq enqueue`.
#[derive(Debug, clap::Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub queue: QueueArg,
    /// Join this batch (opened with `relayq batch open`, not yet sealed).
    #[arg(long)]
    pub batch: Option<i64>,
    /// The job's stage in its batch (default 0).
    #[arg(long, requires = "batch", allow_negative_numbers = true)]
    pub stage: Option<i32>,
    /// Jobs of one group never run at the same time, and run in order.
    #[arg(long)]
    pub group: Option<String>,
    /// At most the queue's limit for this key run at once (`relayq limit N --key K`).
    #[arg(long, value_name = "KEY")]
    pub limit_key: Option<String>,
    /// Lower runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i16,
    /// Attempts the job gets (1..=1000); a non-zero exit is retried while attempts
    /// are left. Default 1: a command is run again only when asked for.
    #[arg(long, default_value_t = 1)]
    pub max_attempts: u16,
    /// Run no earlier than this long from now (e.g. 30s, 5m).
    #[arg(long, value_parser = duration)]
    pub delay: Option<Duration>,
    /// Kill the command (its whole process group) after this long; the attempt fails.
    #[arg(long, value_parser = positive_duration)]
    pub timeout: Option<Duration>,
    /// A name shown by status and progress.
    #[arg(long)]
    pub name: Option<String>,
    /// Working directory on the worker (relative to the worker's own).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment variable for the command, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = env_pair)]
    pub env: Vec<(String, String)>,
    /// While an unfinished job of the queue has this key, enqueue returns that job.
    #[arg(long)]
    pub dedupe_key: Option<String>,
    /// The command; its words are joined with spaces and run by `sh -c` (quote it
    /// whole to keep shell syntax: -- 'make && make test').
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

fn env_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => {
            Ok((k.to_owned(), v.to_owned()))
        }
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// Enqueues the command; prints the job id.
///
/// # Errors
/// Bad input (named by its flag), an unknown or sealed batch, a backend failure.
pub async fn run(db: &str, args: EnqueueArgs) -> anyhow::Result<u8> {
    let command = args.command.join(" ");
    if command.trim().is_empty() {
        return Err(usage("COMMAND: is empty"));
    }
    let mut spec = CommandSpec::new(command);
    spec.name.clone_from(&args.name);
    spec.cwd.clone_from(&args.cwd);
    spec.env = args.env.iter().cloned().collect();
    spec.timeout_ms = args
        .timeout
        .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    let mut job = NewJob::new(args.queue.queue.clone(), spec.to_payload())
        .priority(args.priority)
        .max_attempts(args.max_attempts)
        .enqueued_by(worker_name("enqueue"));
    if let Some(b) = args.batch {
        job = job.in_batch(BatchId(b), args.stage.unwrap_or(0));
    }
    if let Some(g) = &args.group {
        job = job.group(g.clone());
    }
    if let Some(k) = &args.limit_key {
        job = job.limit_key(k.clone());
    }
    if let Some(d) = args.delay {
        job = job.delay(d);
    }
    if let Some(k) = &args.dedupe_key {
        job = job.dedupe_key(k.clone());
    }
    if let Some(name) = &args.name {
        relayq_core::validate::label("name", name).map_err(|e| flag_error(&e))?;
    }
    // Fields checked here, before connecting; whether the backend keeps limit keys
    // is its own answer when the job is stored.
    let fields = relayq_core::Limits {
        limit_keys: true,
        ..relayq_core::Limits::default()
    };
    relayq_core::validate::new_job(&job, &fields).map_err(|e| flag_error(&e))?;
    // With a dedupe key an enqueue is safe to repeat (a copy stored by an attempt whose
    // answer was lost is found, not stored again), so transient failures are retried;
    // without one a repeat could store the job twice, so the failure is reported.
    let retries = if args.dedupe_key.is_some() {
        ENQUEUE_RETRIES
    } else {
        0
    };
    let mut delays = connect::backoff(Some(retries));
    let done = loop {
        match enqueue_once(db, &job).await {
            Ok(done) => break done,
            Err(e) if connect::transient(&e.error) => match delays.next() {
                Some(delay) => {
                    eprintln!(
                        "relayq: {}; retrying in {delay:?} (the job has a dedupe key)",
                        exit::describe(&e.error)
                    );
                    tokio::time::sleep(delay).await;
                }
                None => return Err(e.explained(args.dedupe_key.is_some())),
            },
            Err(e) => return Err(e.error),
        }
    };
    if done.deduplicated {
        eprintln!(
            "an unfinished job with that dedupe key exists: job {}",
            done.id
        );
    }
    outln!("{}", done.id);
    Ok(exit::OK)
}

/// Retries of an enqueue with a dedupe key: about 6 s in all.
const ENQUEUE_RETRIES: usize = 6;

/// A failed enqueue, and whether the job may have been stored.
struct Failed {
    error: anyhow::Error,
    /// The enqueue call was sent: the server may have stored the job.
    sent: bool,
}

impl Failed {
    /// The error, saying what became of the job.
    fn explained(self, deduped: bool) -> anyhow::Error {
        let what = match (self.sent, deduped) {
            (false, _) => "nothing was stored",
            (true, true) => {
                "retried; the job may be stored (its dedupe key makes a later retry safe)"
            }
            (true, false) => {
                "the job may or may not be stored (the server did not answer); check `relayq status` before enqueuing again, or pass --dedupe-key so that a retry is safe"
            }
        };
        self.error.context(format!("enqueue failed: {what}"))
    }
}

/// Opens the database and enqueues `job` once.
async fn enqueue_once(db: &str, job: &NewJob) -> Result<relayq_core::Enqueued, Failed> {
    let backend = backend::open(db, Use::Create)
        .await
        .map_err(|error| Failed { error, sent: false })?;
    let traced = relayq_core::Traced::new(backend);
    traced.enqueue_one(job.clone()).await.map_err(|e| {
        let error = match e {
            CoreError::InvalidInput { .. } => flag_error(&e),
            other => anyhow::Error::new(other).context("cannot enqueue"),
        };
        Failed { error, sent: true }
    })
}

/// An invalid-input error of the core, named by the flag that set the field.
fn flag_error(e: &CoreError) -> anyhow::Error {
    let CoreError::InvalidInput { field, reason } = e else {
        return anyhow::anyhow!("{e}");
    };
    let flag = match *field {
        "payload" => "COMMAND",
        "run_at" => "--delay",
        "max_attempts" => "--max-attempts",
        "dedupe_key" => "--dedupe-key",
        "limit_key" => "--limit-key",
        "enqueued_by" => "(host name)",
        other => return usage(format!("--{other}: {reason}")),
    };
    usage(format!("{flag}: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs_need_a_key_and_an_equals_sign() {
        assert_eq!(env_pair("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(env_pair("A="), Ok(("A".into(), String::new())));
        assert!(env_pair("A").is_err());
        assert!(env_pair("=v").is_err());
    }

    #[test]
    fn core_fields_are_named_by_their_flags() {
        let e = flag_error(&CoreError::invalid(
            "max_attempts",
            "must be 1..=1000, got 0",
        ));
        assert_eq!(e.to_string(), "--max-attempts: must be 1..=1000, got 0");
        let e = flag_error(&CoreError::invalid(
            "group",
            "must not contain control characters",
        ));
        assert_eq!(
            e.to_string(),
            "--group: must not contain control characters"
        );
    }
}
