//! The end of a run: a summary table, a text timeline and the output of failed jobs,
//! all read from the execution log; and the same data as JSON.

use std::{fmt::Write as _, path::Path};

use chrono::{DateTime, Utc};
use relayq_core::{AttemptOutcome, AttemptRecord, BatchId, JobInfo, JobState, OnFailure, Progress};
use serde::Serialize;

use crate::commands::printable;
use crate::spec::{CommandSpec, shorten};

/// What a run did, per job, from the backend's execution log.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The queue.
    pub queue: String,
    /// The batch the plan ran in.
    pub batch: BatchId,
    /// The plan's failure policy.
    pub on_failure: OnFailure,
    /// Whether a `halt` batch saw a dead job.
    pub halted: bool,
    /// The jobs, in plan order.
    pub jobs: Vec<JobReport>,
}

/// One job of a run.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// Its id.
    pub id: i64,
    /// Its name (or shortened command).
    pub name: String,
    /// Its command.
    pub command: String,
    /// Its stage.
    pub stage: Option<i32>,
    /// Its group.
    pub group: Option<String>,
    /// Its final state.
    pub state: JobState,
    /// Attempts it had, of how many.
    pub max_attempts: u16,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// The last error text (with the command's output).
    pub last_error: Option<String>,
    /// Its progress as last reported (SPEC L7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// What it left on success: its command's last output lines (SPEC L8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The ids of the jobs it ran after (SPEC D1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<i64>,
}

impl JobReport {
    /// The report of a job read with `Inspect::job`.
    pub fn new(info: JobInfo) -> Self {
        let (name, command) = CommandSpec::from_payload(&info.payload).map_or_else(
            |_| ("(not a relayq command)".to_owned(), String::new()),
            |spec| (spec.display_name(), spec.command),
        );
        let result = info.result().map(str::to_owned);
        Self {
            id: info.id.0,
            name,
            command,
            stage: info.stage,
            group: info.group,
            state: info.state,
            max_attempts: info.max_attempts,
            created_at: info.created_at,
            finished_at: info.finished_at,
            attempts: info.attempt_log,
            last_error: info.last_error,
            progress: info.progress,
            result,
            after: info.after.iter().map(|a| a.0).collect(),
        }
    }

    /// When its first attempt started.
    pub fn start(&self) -> Option<DateTime<Utc>> {
        self.attempts.first().map(|a| a.started_at)
    }

    /// When it finished (or its last attempt ended).
    pub fn end(&self) -> Option<DateTime<Utc>> {
        self.finished_at
            .or_else(|| self.attempts.last().and_then(|a| a.ended_at))
    }

    /// The first line of its last error.
    fn error_line(&self) -> Option<&str> {
        self.last_error.as_deref().and_then(|e| e.lines().next())
    }
}

impl RunReport {
    /// The run's time origin: when its first job was enqueued.
    pub fn t0(&self) -> Option<DateTime<Utc>> {
        self.jobs.iter().map(|j| j.created_at).min()
    }

    /// When its last job ended.
    pub fn t_end(&self) -> Option<DateTime<Utc>> {
        self.jobs.iter().filter_map(JobReport::end).max()
    }

    /// Jobs that ended dead or cancelled.
    pub fn unsuccessful(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.state != JobState::Succeeded)
            .count()
    }

    /// The summary table: one row per job.
    pub fn table(&self) -> String {
        self.table_of(self.jobs.iter())
    }

    /// The summary table of the jobs that did not succeed, at most `max` rows, and a
    /// line saying how many more there are.
    pub fn unsuccessful_table(&self, max: usize) -> String {
        let failed: Vec<&JobReport> = self
            .jobs
            .iter()
            .filter(|j| j.state != JobState::Succeeded)
            .collect();
        if failed.is_empty() {
            return String::new();
        }
        let mut out = format!("jobs that did not succeed ({}):\n", failed.len());
        out.push_str(&self.table_of(failed.iter().take(max).copied()));
        if failed.len() > max {
            let _ = write!(out, "\n… and {} more", failed.len() - max);
        }
        out
    }

    /// Per stage: how many jobs ended how, and when the stage started and ended.
    pub fn stage_table(&self) -> String {
        let t0 = self.t0().unwrap_or_default();
        let mut stages: Vec<Option<i32>> = self.jobs.iter().map(|j| j.stage).collect();
        stages.sort_unstable();
        stages.dedup();
        let mut table = crate::commands::table([
            "stage",
            "jobs",
            "succeeded",
            "dead",
            "cancelled",
            "start",
            "end",
        ]);
        for stage in stages {
            let jobs: Vec<&JobReport> = self.jobs.iter().filter(|j| j.stage == stage).collect();
            let count = |s| jobs.iter().filter(|j| j.state == s).count().to_string();
            table.add_row([
                opt(stage),
                jobs.len().to_string(),
                count(JobState::Succeeded),
                count(JobState::Dead),
                count(JobState::Cancelled),
                jobs.iter()
                    .filter_map(|j| j.start())
                    .min()
                    .map_or_else(|| "-".into(), |t| offset(t0, t)),
                jobs.iter()
                    .filter_map(|j| j.end())
                    .max()
                    .map_or_else(|| "-".into(), |t| offset(t0, t)),
            ]);
        }
        table.to_string()
    }

    /// The names of the jobs `j` ran after, joined; `-` for none. A job outside the
    /// report shows as its id.
    fn after_names(&self, j: &JobReport) -> String {
        if j.after.is_empty() {
            return "-".into();
        }
        let names: Vec<String> = j
            .after
            .iter()
            .map(|id| {
                self.jobs
                    .iter()
                    .find(|p| p.id == *id)
                    .map_or_else(|| id.to_string(), |p| shorten(&p.name, 20))
            })
            .collect();
        names.join(", ")
    }

    fn table_of<'a>(&self, jobs: impl Iterator<Item = &'a JobReport>) -> String {
        let t0 = self.t0().unwrap_or_default();
        // The `after` column only for a plan with dependencies (SPEC D).
        let graph = self.jobs.iter().any(|j| !j.after.is_empty());
        let mut head = vec![
            "job", "name", "stage", "group", "worker", "attempts", "start", "end", "outcome",
        ];
        if graph {
            head.insert(4, "after");
        }
        let mut table = crate::commands::table(head);
        for j in jobs {
            let outcome = match (j.state, j.error_line()) {
                (JobState::Succeeded, _) => "succeeded (exit 0)".to_owned(),
                (state, Some(err)) => format!("{state}: {}", shorten(&printable(err), 48)),
                (state, None) => state.to_string(),
            };
            let mut row = vec![
                j.id.to_string(),
                shorten(&j.name, 32),
                opt(j.stage),
                j.group.clone().unwrap_or_else(|| "-".into()),
                j.attempts
                    .last()
                    .map_or_else(|| "-".into(), |a| a.worker.clone()),
                format!("{}/{}", counted(&j.attempts), j.max_attempts),
                j.start().map_or_else(|| "-".into(), |t| offset(t0, t)),
                j.end().map_or_else(|| "-".into(), |t| offset(t0, t)),
                outcome,
            ];
            if graph {
                row.insert(4, shorten(&self.after_names(j), 40));
            }
            table.add_row(row);
        }
        table.to_string()
    }

    /// A text timeline: per job a bar over the run's time axis, `width` columns wide.
    pub fn timeline(&self, width: usize) -> String {
        let (Some(t0), Some(t1)) = (self.t0(), self.t_end()) else {
            return "timeline: nothing ran\n".to_owned();
        };
        let span = secs(t0, t1).max(1e-3);
        let width = width.max(10);
        let name_w = self
            .jobs
            .iter()
            .map(|j| shorten(&j.name, 28).chars().count())
            .max()
            .unwrap_or(0);
        let stage_w = self
            .jobs
            .iter()
            .map(|j| opt(j.stage).len())
            .max()
            .unwrap_or(1);
        let mut out = format!(
            "timeline: 0 → {span:.3}s, one column ≈ {:.0}ms  (# ran and succeeded, x failed attempt, - cancelled/released)\n",
            span * 1000.0 / width as f64
        );
        let mut rows: Vec<&JobReport> = self.jobs.iter().collect();
        rows.sort_by_key(|j| (j.stage, j.start(), j.id));
        for j in rows {
            let mut bar = vec![' '; width];
            for a in &j.attempts {
                let mark = match a.outcome {
                    AttemptOutcome::Succeeded => '#',
                    AttemptOutcome::Failed | AttemptOutcome::Expired => 'x',
                    _ => '-',
                };
                let cols = columns(
                    secs(t0, a.started_at) / span,
                    secs(t0, a.ended_at.unwrap_or(t1)) / span,
                    width,
                );
                for cell in &mut bar[cols] {
                    *cell = mark;
                }
            }
            let mut tail = match j.state {
                JobState::Succeeded => String::new(),
                state => format!(" {state}"),
            };
            // The graph's edges (SPEC D): whom the bar waited for.
            if !j.after.is_empty() {
                let _ = write!(tail, " after {}", self.after_names(j));
            }
            let _ = writeln!(
                out,
                "stage {:>stage_w$} {:<name_w$} |{}|{tail}",
                opt(j.stage),
                shorten(&j.name, 28),
                bar.into_iter().collect::<String>(),
            );
        }
        out
    }

    /// The last error, with the command's output, of each job that did not succeed.
    pub fn failures(&self) -> String {
        self.failures_of(usize::MAX)
    }

    /// [`failures`](Self::failures) of the first `max` dead jobs, and how many more.
    pub fn failures_of(&self, max: usize) -> String {
        let mut out = String::new();
        let dead = self
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Dead)
            .count();
        if dead > max {
            let _ = writeln!(
                out,
                "the last error of the first {max} of {dead} dead jobs (all in --report-json):"
            );
        }
        for j in self
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Dead)
            .take(max)
        {
            let _ = writeln!(
                out,
                "── job {} {:?} (stage {}) is dead after {} attempt(s); last error:",
                j.id,
                j.name,
                opt(j.stage),
                counted(&j.attempts)
            );
            for line in j.last_error.as_deref().unwrap_or("(no error text)").lines() {
                let _ = writeln!(out, "    {}", crate::commands::printable(line));
            }
        }
        out
    }

    /// One line: how many jobs ended how, and how long the run took.
    pub fn totals(&self) -> String {
        let count = |s| self.jobs.iter().filter(|j| j.state == s).count();
        let took = match (self.t0(), self.t_end()) {
            (Some(a), Some(b)) => format!(" in {:.3}s", secs(a, b)),
            _ => String::new(),
        };
        let mut line = format!(
            "{}{took}: {} succeeded, {} dead, {} cancelled",
            crate::words::plural(self.jobs.len(), "job"),
            count(JobState::Succeeded),
            count(JobState::Dead),
            count(JobState::Cancelled)
        );
        if self.halted {
            line.push_str(" (on_failure = \"halt\": the rest of the batch was cancelled)");
        }
        line
    }

    /// Writes the report as JSON to `path`.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("cannot write the report to {}: {e}", path.display()))
    }
}

/// Attempts that counted (released ones do not).
fn counted(attempts: &[AttemptRecord]) -> usize {
    attempts
        .iter()
        .filter(|a| a.outcome != AttemptOutcome::Released)
        .count()
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Seconds from `a` to `b`.
fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// `1.234s` after `t0`.
fn offset(t0: DateTime<Utc>, t: DateTime<Utc>) -> String {
    format!("{:.3}s", secs(t0, t))
}

/// The columns covering `from..to` (fractions of the axis), at least one.
fn columns(from: f64, to: f64, width: usize) -> std::ops::Range<usize> {
    let w = width as f64;
    let start = ((from.clamp(0.0, 1.0) * w).floor() as usize).min(width - 1);
    let end = ((to.clamp(0.0, 1.0) * w).ceil() as usize).clamp(start + 1, width);
    start..end
}

#[cfg(test)]
mod tests;
