//! `relayq job ID`: one job with its progress, its attempt log, the result a successful
//! command left, and the last error (with the failed command's output).

use anyhow::bail;
use relayq_core::{Backend, Error as CoreError, JobId, JobInfo};

use super::{printable, table, time};
use crate::{
    backend::{self, Use},
    exit::{self, usage},
    report::JobReport,
};

/// Arguments of `relayq job`.
#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The job.
    pub id: i64,
    /// Its queue. Without it the job is looked for in every queue in use: ids are
    /// unique across queues on SQL backends, but count per queue on Redis and in
    /// memory, where an id found in two queues asks for this.
    #[arg(long, short = 'q', env = "RELAYQ_QUEUE")]
    pub queue: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Say what holds the job back (its stage, group, queue, time), or that it runs or
    /// finished.
    #[arg(long)]
    pub why: bool,
}

/// Shows the job; returns the exit code.
///
/// # Errors
/// No database, an unknown job, a backend failure.
pub async fn run(db: &str, args: JobArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Read).await?;
    let info = find(&*backend, args.queue.as_deref(), JobId(args.id)).await?;
    let queue = info.queue.clone();
    let why = if args.why {
        Some(super::why::lines(
            &relayq_core::InspectExt::why(&*backend, &queue, JobId(args.id)).await?,
        ))
    } else {
        None
    };
    let job = JobReport::new(info);
    if args.json {
        let mut value = serde_json::to_value(&job)?;
        if let (Some(lines), Some(map)) = (&why, value.as_object_mut()) {
            map.insert("why".into(), serde_json::json!(lines));
        }
        outln!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(exit::OK);
    }
    outln!("job {} of queue {:?}: {}", job.id, queue, job.state);
    for line in why.iter().flatten() {
        outln!("  why:      {line}");
    }
    outln!("  name:     {}", printable(&job.name));
    outln!("  command:  {}", printable(&job.command));
    if let Some(stage) = job.stage {
        outln!("  stage:    {stage}");
    }
    if let Some(group) = &job.group {
        outln!("  group:    {group}");
    }
    if !job.after.is_empty() {
        let ids: Vec<String> = job.after.iter().map(|id| format!("job {id}")).collect();
        outln!("  after:    {}", ids.join(", "));
    }
    outln!("  enqueued: {}", time(job.created_at));
    if let Some(p) = &job.progress {
        outln!("  progress: {} (attempt {})", super::progress(p), p.attempt);
    }
    if job.attempts.is_empty() {
        outln!("  attempts: none yet (of {})", job.max_attempts);
    } else {
        let mut t = table(["attempt", "worker", "start", "end", "outcome", "error"]);
        for a in &job.attempts {
            t.add_row([
                a.attempt.to_string(),
                printable(&a.worker).into_owned(),
                time(a.started_at),
                a.ended_at.map_or_else(|| "-".into(), time),
                a.outcome.to_string(),
                printable(
                    a.error
                        .as_deref()
                        .and_then(|e| e.lines().next())
                        .unwrap_or(""),
                )
                .into_owned(),
            ]);
        }
        outln!("{t}");
    }
    if let Some(result) = &job.result {
        outln!("result (its last output lines):");
        for line in relayq_core::redact::urls(result).lines() {
            outln!("    {}", printable(line));
        }
    } else if let Some(out) = job.attempts.iter().rev().find_map(|a| a.output.as_deref()) {
        outln!("output (last 64 KiB):");
        for line in relayq_core::redact::urls(out).lines() {
            outln!("    {}", printable(line));
        }
    }
    if let Some(err) = &job.last_error {
        outln!("last error:");
        for line in relayq_core::redact::urls(err).lines() {
            outln!("    {}", printable(line));
        }
    }
    Ok(exit::OK)
}

/// Job `id` of `queue`, or of whichever queue holds it.
pub(crate) async fn find(
    backend: &dyn Backend,
    queue: Option<&str>,
    id: JobId,
) -> anyhow::Result<JobInfo> {
    if let Some(q) = queue {
        return Ok(backend.job(q, id).await?);
    }
    let queues = backend.queues().await?;
    let mut found = Vec::new();
    for q in &queues {
        match backend.job(q, id).await {
            Ok(info) => found.push(info),
            Err(CoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match found.len() {
        0 => bail!(CoreError::not_found(format!(
            "job {id} in any of the {} queue(s) in use",
            queues.len()
        ))),
        1 => Ok(found.remove(0)),
        _ => {
            let names: Vec<String> = found.iter().map(|j| format!("{:?}", j.queue)).collect();
            Err(usage(format!(
                "job {id} exists in queues {}: ids count per queue on this backend; name one with -q",
                names.join(", ")
            )))
        }
    }
}
