//! Live progress of a run: indicatif bars (one per stage, one line per running command)
//! on a terminal, plain timestamped lines otherwise.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use relayq_core::{BatchProgress, JobId, StageProgress};

use crate::{
    exec::Ending,
    handler::{EventKind, JobEvent},
};

/// The progress display of one run.
pub struct Progress {
    t0: Instant,
    view: View,
    /// Stages already reported finished (plain lines).
    finished: BTreeSet<i32>,
    /// Jobs of each stage whose command runs here now: the batch's `running` counts
    /// every leased job, jobs claimed ahead and waiting for a slot among them.
    started: HashMap<i32, u64>,
}

enum View {
    Bars {
        multi: MultiProgress,
        stages: BTreeMap<i32, ProgressBar>,
        running: HashMap<(JobId, u32), ProgressBar>,
    },
    Plain,
}

impl Progress {
    /// A display for a run with these `(stage, job count)`s: bars when `bars`, else
    /// plain lines on stdout.
    pub fn new(stages: &[(i32, u64)], bars: bool) -> Self {
        let view = if bars {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let style = ProgressStyle::with_template(
                "{prefix:>11} [{bar:30.green/dim}] {pos:>3}/{len:<3} {msg}",
            )
            .expect("the template is valid")
            .progress_chars("█▓░");
            let stages = stages
                .iter()
                .map(|&(stage, n)| {
                    let bar = multi.add(ProgressBar::new(n).with_style(style.clone()));
                    bar.set_prefix(format!("stage {stage}"));
                    bar.set_message("waiting");
                    (stage, bar)
                })
                .collect();
            View::Bars {
                multi,
                stages,
                running: HashMap::new(),
            }
        } else {
            View::Plain
        };
        Self {
            t0: Instant::now(),
            view,
            finished: BTreeSet::new(),
            started: HashMap::new(),
        }
    }

    /// Shows a line above the bars, or as a plain line.
    pub fn line(&self, text: &str) {
        match &self.view {
            View::Bars { multi, .. } => {
                // Only fails when the terminal is gone; then there is nobody to tell.
                let _ = multi.println(text);
            }
            View::Plain => outln!("{} {text}", stamp(self.t0.elapsed())),
        }
    }

    /// A job started or ended on one of our workers.
    pub fn event(&mut self, ev: &JobEvent) {
        let stage = ev
            .stage
            .map_or_else(String::new, |s| format!("stage {s}  "));
        let tries = format!("attempt {}/{}", ev.attempt, ev.max_attempts);
        if let Some(stage) = ev.stage {
            let n = self.started.entry(stage).or_default();
            match &ev.kind {
                EventKind::Started { .. } => *n += 1,
                EventKind::Ended { .. } => *n = n.saturating_sub(1),
                EventKind::BadPayload { .. } => {}
            }
        }
        match &ev.kind {
            EventKind::Started { .. } => match &mut self.view {
                View::Bars { multi, running, .. } => {
                    // Into the MultiProgress before anything is set: a bar not yet added
                    // draws itself on stderr, which on a terminal is the same screen,
                    // under the MultiProgress's feet (stale copies of every bar).
                    let bar = multi.add(ProgressBar::hidden());
                    bar.set_style(
                        ProgressStyle::with_template(
                            "            {spinner:.cyan} {prefix:.bold} {msg} {elapsed:.dim}",
                        )
                        .expect("the template is valid"),
                    );
                    bar.set_prefix(ev.name.clone());
                    bar.set_message(match ev.stage {
                        Some(s) => format!("(stage {s}, {tries})"),
                        None => format!("({tries})"),
                    });
                    bar.enable_steady_tick(Duration::from_millis(100));
                    running.insert((ev.job, ev.attempt), bar);
                }
                // One line per job, when it ends: a start line each too doubled a long
                // run's log without saying anything its end line does not.
                View::Plain => {}
            },
            EventKind::Ended { ending, elapsed } => {
                if let View::Bars { multi, running, .. } = &mut self.view
                    && let Some(bar) = running.remove(&(ev.job, ev.attempt))
                {
                    bar.finish_and_clear();
                    multi.remove(&bar);
                }
                let took = format_secs(*elapsed);
                if ending.success() {
                    if matches!(self.view, View::Plain) {
                        self.line(&format!(
                            "ok      {stage}{}  in {took}  (job {}, {tries})",
                            ev.name, ev.job
                        ));
                    }
                } else {
                    let next = if matches!(ending, Ending::Interrupted) {
                        String::new()
                    } else if ev.attempt < u32::from(ev.max_attempts) {
                        format!("; will retry ({tries})")
                    } else {
                        format!("; no attempts left ({tries})")
                    };
                    self.line(&format!(
                        "failed  {stage}{}  {ending} after {took}{next}",
                        ev.name
                    ));
                }
            }
            EventKind::BadPayload { error } => {
                self.line(&format!("failed  job {}: {error}", ev.job));
            }
        }
    }

    /// New counts of the batch.
    pub fn batch(&mut self, progress: &BatchProgress) {
        for s in &progress.stages {
            if let View::Bars { stages, .. } = &self.view
                && let Some(bar) = stages.get(&s.stage)
            {
                bar.set_length(s.total());
                bar.set_position(s.succeeded + s.dead + s.cancelled);
                let here = self.started.get(&s.stage).copied().unwrap_or(0);
                bar.set_message(stage_message(s, here));
            }
            if s.unfinished() == 0 && s.total() > 0 && self.finished.insert(s.stage) {
                if let View::Bars { stages, .. } = &self.view
                    && let Some(bar) = stages.get(&s.stage)
                {
                    bar.finish();
                } else {
                    self.line(&format!(
                        "stage {} finished: {}",
                        s.stage,
                        counts(s).join(", ")
                    ));
                }
            }
        }
    }

    /// Ends the display: running lines go, stage bars stay as they are.
    pub fn finish(self) {
        if let View::Bars {
            stages, running, ..
        } = self.view
        {
            for bar in running.values() {
                bar.finish_and_clear();
            }
            for bar in stages.values() {
                bar.abandon();
            }
        }
    }
}

/// A stage's line: `here` of its leased jobs run a command in this process; the rest
/// are claimed but not started here (waiting in a worker's buffer for a slot, or
/// running elsewhere), and are not called running.
fn stage_message(s: &StageProgress, here: u64) -> String {
    if s.unfinished() == 0 {
        return counts(s).join(", ");
    }
    if s.running == 0 && s.succeeded + s.dead + s.cancelled == 0 {
        return "waiting".to_owned();
    }
    let here = here.min(s.running);
    let mut parts = vec![format!("{here} running")];
    if s.running > here {
        parts.push(format!("{} more claimed", s.running - here));
    }
    parts.extend(counts(s).into_iter().filter(|c| !c.ends_with("succeeded")));
    parts.join(", ")
}

/// "4 succeeded", "1 dead", "2 cancelled": the non-zero finished counts.
fn counts(s: &StageProgress) -> Vec<String> {
    [
        (s.succeeded, "succeeded"),
        (s.dead, "dead"),
        (s.cancelled, "cancelled"),
    ]
    .into_iter()
    .filter(|&(n, _)| n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect()
}

/// `[  1.234s]`: time since the run started.
fn stamp(d: Duration) -> String {
    format!("[{:>8}]", format_secs(d))
}

/// `0.204s`.
pub fn format_secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_messages_say_what_is_going_on() {
        let mut s = StageProgress {
            stage: 100,
            pending: 2,
            ..StageProgress::default()
        };
        assert_eq!(stage_message(&s, 0), "waiting");
        s.running = 1;
        s.pending = 1;
        s.dead = 1;
        assert_eq!(stage_message(&s, 1), "1 running, 1 dead");
        // Thirteen leased, four of them started here: the rest are not called running.
        s.running = 13;
        assert_eq!(stage_message(&s, 4), "4 running, 9 more claimed, 1 dead");
        assert_eq!(stage_message(&s, 20), "13 running, 1 dead");
        s = StageProgress {
            stage: 100,
            succeeded: 3,
            cancelled: 1,
            ..StageProgress::default()
        };
        assert_eq!(stage_message(&s, 0), "3 succeeded, 1 cancelled");
    }
}
