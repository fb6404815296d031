//! `relayq schedule ...`: recurring commands or plans (SPEC S), fired by `relayq work`.

use std::path::PathBuf;

use relayq_core::{
    BatchId, Error as CoreError, NewJob,
    schedule::{Fired, Missed, Schedule, ScheduleInfo},
};

use super::{printable, table, time};
use crate::{
    args::{QueueArg, duration},
    backend::{self, Use},
    exit::{self, usage},
    plan,
    spec::CommandSpec,
};

/// `relayq schedule ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ScheduleCommand {
    /// Add a schedule, or replace the one of that name (its last slot is kept, so no
    /// slot runs twice). `relayq work` on the queue enqueues each slot once, however
    /// many workers run.
    Add(AddArgs),
    /// List the queue's schedules: last slot, what it made, next slot.
    List {
        #[command(flatten)]
        queue: QueueArg,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule; the jobs it made stay.
    Rm(NameArgs),
    /// Pause a schedule: no slot runs until `resume`.
    Pause(NameArgs),
    /// Resume a schedule; slots missed meanwhile follow its --catch-up policy.
    Resume(NameArgs),
    /// Enqueue one slot's jobs now, outside the timetable (paused or not).
    RunNow(NameArgs),
}

/// A schedule's name and queue.
#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// The schedule's name.
    pub name: String,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// Arguments of `relayq schedule add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The schedule's name (unique in its queue).
    pub name: String,
    #[command(flatten)]
    pub queue: QueueArg,
    /// When: a cron expression, 5 fields or 6 with seconds first ('0 2 * * *').
    #[arg(long)]
    pub cron: String,
    /// The time zone the expression is read in (IANA name).
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Slots missed while no worker ran: `latest` (run the last one once), `skip`
    /// (run none), or a window such as `1h` (run each one of the last hour).
    #[arg(long, default_value = "latest", value_parser = missed)]
    pub catch_up: Missed,
    /// Each slot runs this plan as one staged batch.
    #[arg(long, conflicts_with = "command")]
    pub plan: Option<PathBuf>,
    /// Attempts each slot's command gets.
    #[arg(long, default_value_t = 1)]
    pub max_attempts: u16,
    /// Each slot enqueues this command (run by `sh -c` on a worker).
    #[arg(last = true, num_args = 1.., required_unless_present = "plan")]
    pub command: Vec<String>,
}

fn missed(text: &str) -> Result<Missed, String> {
    match text {
        "latest" => Ok(Missed::Latest),
        "skip" => Ok(Missed::Skip),
        window => duration(window)
            .map(Missed::all_within)
            .map_err(|e| format!("expected latest, skip or a window such as 1h: {e}")),
    }
}

/// Runs the schedule subcommand; returns the exit code.
///
/// # Errors
/// Bad input (named by its flag; nothing stored), an unknown schedule, a backend
/// failure.
pub async fn run(db: &str, cmd: ScheduleCommand) -> anyhow::Result<u8> {
    match cmd {
        ScheduleCommand::Add(args) => add(db, args).await,
        ScheduleCommand::List { queue, json } => list(db, &queue.queue, json).await,
        ScheduleCommand::Rm(a) => {
            let b = backend::open(db, Use::Existing).await?;
            if !b.delete_schedule(&a.queue.queue, &a.name).await? {
                return Err(anyhow::Error::new(CoreError::not_found(format!(
                    "schedule {:?} in queue {:?}",
                    a.name, a.queue.queue
                ))));
            }
            outln!("schedule {} deleted", printable(&a.name));
            Ok(exit::OK)
        }
        ScheduleCommand::Pause(a) => pause(db, a, true).await,
        ScheduleCommand::Resume(a) => pause(db, a, false).await,
        ScheduleCommand::RunNow(a) => {
            let b = backend::open(db, Use::Existing).await?;
            match b.run_schedule_now(&a.queue.queue, &a.name).await? {
                Fired::Made {
                    batch: Some(id), ..
                } => outln!("batch {id}"),
                Fired::Made { jobs, .. } => {
                    for e in jobs {
                        outln!("{}", e.id);
                    }
                }
                Fired::Gone => {
                    return Err(anyhow::Error::new(CoreError::not_found(format!(
                        "schedule {:?} in queue {:?}",
                        a.name, a.queue.queue
                    ))));
                }
                other => return Err(anyhow::anyhow!("the schedule did not run: {other:?}")),
            }
            Ok(exit::OK)
        }
    }
}

async fn pause(db: &str, a: NameArgs, paused: bool) -> anyhow::Result<u8> {
    let b = backend::open(db, Use::Existing).await?;
    b.pause_schedule(&a.queue.queue, &a.name, paused).await?;
    let what = if paused { "paused" } else { "resumed" };
    outln!("schedule {} {what}", printable(&a.name));
    Ok(exit::OK)
}

async fn add(db: &str, args: AddArgs) -> anyhow::Result<u8> {
    let q = &args.queue.queue;
    let mut s = Schedule::new(q.clone(), args.name.clone(), args.cron.clone())
        .time_zone(args.tz.clone())
        .missed(args.catch_up);
    if let Some(path) = &args.plan {
        let plan = plan::load(path).map_err(|e| usage(e.0))?;
        if plan.has_after() {
            // A schedule keeps each job on its own, not the plan's graph.
            return Err(usage(format!(
                "--plan {}: a plan whose jobs run after others (`after`) cannot be scheduled yet",
                path.display()
            )));
        }
        s = s.batch(plan.on_failure);
        for mut job in plan.new_jobs(q, BatchId(0)).map_err(|e| usage(e.0))? {
            // The slot opens the batch; the job keeps its stage.
            job.batch = None;
            s = s.job(job);
        }
    } else {
        let command = args.command.join(" ");
        if command.trim().is_empty() {
            return Err(usage("COMMAND: is empty"));
        }
        let job = NewJob::new(q.clone(), CommandSpec::new(command).to_payload())
            .max_attempts(args.max_attempts);
        s = s.job(job);
    }
    // Checked before connecting: bad input is refused fast, naming its flag.
    relayq_core::validate::schedule(&s, &relayq_core::Limits::default())
        .map_err(|e| flag_error(&e))?;
    let b = backend::open(db, Use::Create).await?;
    b.put_schedule(&s).await.map_err(|e| flag_error(&e))?;
    let info = b
        .schedules(q)
        .await?
        .into_iter()
        .find(|i| i.name == args.name);
    match info.and_then(|i| i.next_slot) {
        Some(next) => outln!(
            "schedule {} added; next slot {}",
            printable(&args.name),
            time(next)
        ),
        None => outln!("schedule {} added", printable(&args.name)),
    }
    Ok(exit::OK)
}

fn flag_error(e: &CoreError) -> anyhow::Error {
    let CoreError::InvalidInput { field, reason } = e else {
        return anyhow::anyhow!("{e}");
    };
    let flag = match *field {
        "cron" => "--cron",
        "time_zone" => "--tz",
        "missed" => "--catch-up",
        "name" => "NAME",
        "payload" | "jobs" => "COMMAND",
        "queue" => "--queue",
        "max_attempts" => "--max-attempts",
        other => other,
    };
    usage(format!("{flag}: {reason}"))
}

async fn list(db: &str, queue: &str, json: bool) -> anyhow::Result<u8> {
    let b = backend::open(db, Use::Existing).await?;
    let all = b.schedules(queue).await?;
    if json {
        for s in &all {
            outln!("{}", to_json(s));
        }
        return Ok(exit::OK);
    }
    if all.is_empty() {
        outln!("no schedules in queue {queue:?}");
        return Ok(exit::OK);
    }
    let mut t = table([
        "name",
        "cron",
        "zone",
        "state",
        "last slot",
        "made",
        "next slot",
    ]);
    for s in &all {
        let (cron, zone) = s
            .definition
            .as_ref()
            .map_or(("?".to_owned(), "?".to_owned()), |d| {
                (d.cron.clone(), d.time_zone.clone())
            });
        t.add_row([
            printable(&s.name).into_owned(),
            printable(&cron).into_owned(),
            zone,
            if s.paused { "paused" } else { "running" }.to_owned(),
            s.last_slot.map_or_else(|| "-".to_owned(), time),
            made(s),
            s.next_slot.map_or_else(|| "-".to_owned(), time),
        ]);
    }
    outln!("{t}");
    Ok(exit::OK)
}

fn made(s: &ScheduleInfo) -> String {
    match (s.last_batch, s.last_job) {
        (Some(b), _) => format!("batch {b}"),
        (None, Some(j)) => format!("job {j}"),
        _ => "-".to_owned(),
    }
}

fn to_json(s: &ScheduleInfo) -> serde_json::Value {
    serde_json::json!({
        "queue": s.queue,
        "name": s.name,
        "cron": s.definition.as_ref().map(|d| d.cron.clone()),
        "time_zone": s.definition.as_ref().map(|d| d.time_zone.clone()),
        "paused": s.paused,
        "last_slot": s.last_slot,
        "last_job": s.last_job.map(|j| j.0),
        "last_batch": s.last_batch.map(|b| b.0),
        "next_slot": s.next_slot,
    })
}
