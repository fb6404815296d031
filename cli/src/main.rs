//! # relayq — the command-line tool
//!
//! `relayq` runs shell commands as relayq jobs: a whole staged **plan** on local
//! workers with live progress (`relayq run`), or single commands queued for long-running
//! workers (`relayq enqueue`, `relayq work`), with the tools to watch and operate them
//! (`status`, `wait`, `job`, `dead`, `cancel`, `pause`, `resume`, `limit`, `prune`,
//! `batch`). The database defaults to
//! `sqlite://relayq.db` in the current folder: no server needed.
//!
//! ```sh
//! relayq run examples/plan.toml            # a staged plan, 4 commands at once
//! relayq run plan.toml --workers 8 --db sqlite:///var/lib/relayq.db
//! ```
//!
//! ## Plans
//!
//! A plan is a TOML file of `[[job]]` tables. Every job is one shell command, run by
//! `sh -c`:
//!
//! ```toml
//! on_failure = "halt"        # or "continue" (default): what a dead job does to the rest of the batch
//!
//! [[job]]
//! name = "extract-a"         # optional, unique; shown in progress and summary
//! command = "sleep 0.2 && echo a"
//! stage = 100                # optional, default 0: a stage starts when every lower one ended
//! group = "db"               # optional: jobs of one group never overlap, and run in order
//! priority = 0               # optional, lower runs first
//! max_attempts = 1           # optional, default 1 (1..=1000)
//! timeout = "30s"            # optional: kill the command after this long ("500ms", "2m")
//! env = { KEY = "v" }        # optional, added to the environment
//! cwd = "some/dir"           # optional, relative to where `relayq run` is started
//! ```
//!
//! `relayq run` validates the whole plan first (TOML errors with file, line and column;
//! field errors naming the job, e.g. `plan.toml:11:11: job 3 ("load"): field "timeout":
//! invalid duration "3x"`); a bad plan stores nothing. It then opens a batch, enqueues
//! every job in one atomic call, seals the batch and runs the commands on `--workers`
//! local worker slots, showing one bar per stage and a line per running command (plain
//! lines when stdout is not a terminal). At the end it prints a summary table and a
//! timeline read from the execution log, and the output of every failed job. The exit
//! code is 0 when every job succeeded, 1 when any ended dead or cancelled.
//!
//! **max_attempts defaults to 1**: plan steps are commands with side effects relayq
//! cannot see, so running one again is asked for, not assumed. A non-zero exit, a
//! signal, a timeout or a command that cannot start fails the attempt; with attempts
//! left it is retried after a backoff (0.5–1 s, doubling).
//!
//! **Commands and their processes**: each command runs in its own process group with
//! stdin closed; the last 64 KiB of its combined stdout and stderr are kept and, when
//! it fails, stored with the error in the execution log. On timeout, on Ctrl-C, and
//! when the shell exits, the whole process group is killed: nothing a job started
//! outlives it.
//!
//! ## Subcommands
//!
//! | command | what |
//! |---|---|
//! | `run PLAN.toml [--workers N] [--queue Q] [--timeout D] [--report-json F] [--full]` | run a plan (above); above 50 jobs the end shows totals per stage and failures first (`--full`: every job) |
//! | `enqueue [--queue Q] [--batch B --stage S] [--group G] [--priority P] [--max-attempts N] [--delay D] [--timeout D] -- COMMAND...` | queue one command; prints its id |
//! | `work [--queue Q]... [--concurrency N] [--shutdown-timeout D] [--retention D] [--no-schedules]` | execute queued commands until Ctrl-C / SIGTERM, then shut down gracefully; prunes finished jobs older than `--retention` (7 days) every minute; enqueues the due slots of its queues' schedules |
//! | `status [-q Q] [--batch ID] [--all] [--json]` | counts per state, running jobs (worker, start), a batch's stages; `--all`: every queue in use |
//! | `wait BATCH_ID [-q Q] [--stage S] [--timeout D] [--json]` | wait for a stage or a batch: exit 0 reached, 1 reached with failures, 124 timeout |
//! | `job ID [-q Q] [--why] [--json]` | one job: attempts, workers, times, last error with output; found in any queue without `-q`; `--why`: what holds it back (its stage, group, paused queue, limit, time) |
//! | `dead list [--json]` / `dead retry [ID...]` | dead jobs; put them back to ready |
//! | `cancel (--job ID \| --batch ID)` | cancel a job or a whole batch |
//! | `run-now --job ID [-q Q]` | a scheduled job, or a retry in its backoff, due now |
//! | `pause` / `resume` / `limit N\|none` `[-q Q]` | stop and restart claims of a queue; cap its running jobs across workers |
//! | `prune [-q Q] [--older-than D] [--json]` | delete finished jobs older than D (default 7 days) now |
//! | `batch open [--on-failure halt]` / `batch seal ID` | batches for `enqueue --batch` |
//! | `schedule add NAME --cron EXPR [--tz ZONE] [--catch-up latest\|skip\|WINDOW] (--plan PLAN.toml \| -- COMMAND...)` | a recurring command or plan; `relayq work` enqueues each slot once |
//! | `schedule list [--json]` / `rm` / `pause` / `resume` / `run-now NAME` | see and operate schedules |
//!
//! `--db URL` (or `RELAYQ_DB`) selects the database: `sqlite://PATH` (default
//! `sqlite://relayq.db`), `postgres://USER@HOST/DB` (with the default `postgres`
//! feature; relayq's tables live in the schema `relayq`, created on first use),
//! `redis://HOST:PORT` (with the default `redis` feature; keys under `relayq:`), or
//! `memory://` for `run` alone. SQL Server URLs are recognised but not built into this
//! binary yet. `--queue` (or
//! `RELAYQ_QUEUE`) defaults to `default`. Exit codes: 0 ok, 1 failed jobs or a failed
//! command, 2 bad input (nothing stored), 124 timeout, 130 interrupted.
//!
//! ## Security
//!
//! **Whoever can enqueue can run commands on the workers.** A job's payload is a shell
//! command line that `relayq work` (and `relayq run`) executes with the worker's user,
//! environment and file access. Give write access to the database (the SQLite file, or
//! the server's credentials) only to those you would give a shell on every worker
//! machine, and run workers as a user with no more rights than the jobs need.

// Output goes through `outln!`/`out!` (a locked stdout handle, write errors ignored),
// not `println!`: see `macros.rs`.
#[macro_use]
mod macros;

mod args;
mod backend;
mod commands;
mod connect;
mod counts;
mod dashboard;
mod exec;
mod exit;
mod guard;
mod handler;
mod job_progress;
mod output;
mod plan;
mod progress;
mod report;
mod run;
mod spec;
mod telemetry;
mod words;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::commands::{
    batch::BatchCommand,
    cancel::CancelArgs,
    dead::DeadCommand,
    enqueue::EnqueueArgs,
    job::JobArgs,
    prune::PruneArgs,
    queue::{LimitArgs, QueueOnly},
    run_now::RunNowArgs,
    schedule::ScheduleCommand,
    status::StatusArgs,
    wait::WaitArgs,
    work::WorkArgs,
};

/// Log filter unless `RELAYQ_LOG` says otherwise: warnings, except the worker's "settle
/// refused" for a job cancelled while it ran (expected after `cancel` or Ctrl-C; the
/// execution log has the story).
const DEFAULT_LOG: &str = "warn,relayq_core::worker::settler=error";

const SECURITY: &str = "Security: whoever can enqueue can run commands on the workers. A job is a \
shell command line that `relayq work` and `relayq run` execute as the worker's user; give write \
access to the database only to those you would give a shell on every worker machine.";

/// relayq: run staged plans of shell commands, and queue commands for workers.
#[derive(Debug, Parser)]
#[command(name = "relayq", version, after_help = SECURITY)]
struct Cli {
    /// The database (the help lists every scheme this binary has: see `backend::db_help`).
    #[arg(long, global = true, env = "RELAYQ_DB", default_value = backend::DEFAULT_DB)]
    db: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a plan of shell commands (stages, groups) on local workers, with progress
    ///
    /// The plan is validated whole, enqueued as one sealed batch in one atomic call, and
    /// run on --workers slots; stage N starts when every lower stage ended, jobs of one
    /// group never overlap. Exit code 0 when every job succeeded, 1 when any ended dead
    /// or cancelled, 2 for a bad plan (nothing stored).
    ///
    /// Plan format (every field but `command` optional):
    ///
    ///   on_failure = "halt"          # or "continue" (default)
    ///   [[job]]
    ///   name = "extract-a"           # unique; shown in progress and summary
    ///   command = "sleep 0.2 && echo a"
    ///   stage = 100                  # default 0
    ///   group = "db"                 # jobs of a group never overlap
    ///   priority = 0                 # lower runs first
    ///   max_attempts = 1             # default 1: retrying is opt-in
    ///   timeout = "30s"              # kill the command's process group after this
    ///   env = { KEY = "v" }
    ///   cwd = "some/dir"             # relative to the current directory
    ///
    /// Progress: a command may write lines `relayq-progress PERCENT [MESSAGE]` to file
    /// descriptor 3 (named by $RELAYQ_PROGRESS_FD); `relayq job` and `relayq status` show
    /// the last one. A successful command's last output lines (up to 64 KiB) are its
    /// result.
    #[command(verbatim_doc_comment, after_help = SECURITY)]
    Run(run::RunArgs),
    /// Queue one shell command as a job; prints its id.
    #[command(after_help = SECURITY)]
    Enqueue(EnqueueArgs),
    /// Execute queued commands until Ctrl-C or SIGTERM, then shut down gracefully.
    ///
    /// Each job's payload is a shell command line run with `sh -c` as this process's
    /// user: whoever can enqueue into the served queues can run commands here. On
    /// Ctrl-C / SIGTERM the worker stops claiming, lets running commands finish for up to
    /// --shutdown-timeout, then kills them and releases their jobs for another worker.
    ///
    /// A command may report progress by writing lines `relayq-progress PERCENT [MESSAGE]`
    /// to file descriptor 3 (named by $RELAYQ_PROGRESS_FD), e.g.
    /// `echo "relayq-progress 40 copying table x" >&3`; `relayq job` and `relayq status`
    /// show the last one. A successful command's last output lines (up to 64 KiB) are
    /// its result.
    #[command(after_help = SECURITY)]
    Work(WorkArgs),
    /// Counts per state, running jobs with worker, start time and progress, a batch's
    /// stages.
    Status(StatusArgs),
    /// Wait for a batch (or one of its stages) to finish.
    ///
    /// Exit code 0 when reached with every job succeeded, 1 when reached with dead or
    /// cancelled jobs, 124 on timeout.
    Wait(WaitArgs),
    /// Show one job: its attempts (worker, start, end, outcome) and last error.
    Job(JobArgs),
    /// Dead jobs: list them, or put them back to ready.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Cancel a job, a whole batch, or every unfinished job of a queue.
    Cancel(CancelArgs),
    /// Run a scheduled job now, or a retry now instead of after its backoff.
    RunNow(RunNowArgs),
    /// Pause a queue: workers claim nothing from it until `relayq resume`.
    Pause(QueueOnly),
    /// Resume a paused queue.
    Resume(QueueOnly),
    /// Limit how many jobs of a queue run at once across all workers (`none` lifts it).
    Limit(LimitArgs),
    /// Delete finished jobs older than --older-than (the maintenance pass, by hand).
    ///
    /// `relayq work` runs the same pass every minute with a retention of 7 days
    /// (--retention); this is for other set-ups, or to prune now.
    Prune(PruneArgs),
    /// Recurring commands or plans: each slot enqueued once by `relayq work`.
    #[command(subcommand, after_help = SECURITY)]
    Schedule(ScheduleCommand),
    /// Open or seal a batch, for jobs added with `relayq enqueue --batch`.
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Serve the web dashboard (queues, batches, running and dead jobs, /metrics).
    ///
    /// Listens on loopback unless told otherwise; any other address needs --token.
    Dashboard(dashboard::DashboardArgs),
}

fn main() -> ExitCode {
    // The guard of one job's command (`guard.rs`), started by this binary's workers:
    // a small synchronous process, no runtime, no command-line parsing.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(guard::SUBCOMMAND) {
        return ExitCode::from(guard::main(&args[2..]));
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(cli()),
        Err(e) => {
            eprintln!("relayq: error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line, with `--db`'s help naming every scheme this binary was built with.
fn parse() -> Cli {
    let matches = Cli::command()
        .mut_arg("db", |a| a.help(backend::db_help()))
        .get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

async fn cli() -> ExitCode {
    let cli = parse();
    // Kept to the end of the command: dropping it sends the buffered spans.
    let _telemetry = telemetry::init(DEFAULT_LOG);
    let db = cli.db.as_str();
    let result = match cli.command {
        Command::Run(args) => run::run(db, args).await,
        Command::Enqueue(args) => commands::enqueue::run(db, args).await,
        Command::Work(args) => commands::work::run(db, args).await,
        Command::Status(args) => commands::status::run(db, args).await,
        Command::Wait(args) => commands::wait::run(db, args).await,
        Command::Job(args) => commands::job::run(db, args).await,
        Command::Dead(cmd) => commands::dead::run(db, cmd).await,
        Command::Cancel(args) => commands::cancel::run(db, args).await,
        Command::RunNow(args) => commands::run_now::run(db, args).await,
        Command::Pause(args) => commands::queue::pause(db, args).await,
        Command::Resume(args) => commands::queue::resume(db, args).await,
        Command::Limit(args) => commands::queue::limit(db, args).await,
        Command::Prune(args) => commands::prune::run(db, args).await,
        Command::Batch(cmd) => commands::batch::run(db, cmd).await,
        Command::Schedule(cmd) => commands::schedule::run(db, cmd).await,
        Command::Dashboard(args) => dashboard::run(db, args).await,
    };
    match result {
        Ok(code) => exit::exit(code),
        Err(e) => {
            eprintln!("relayq: error: {}", exit::describe(&e));
            exit::exit(exit::code_for(&e))
        }
    }
}
