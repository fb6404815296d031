//! The rate cell (SPEC K8, K9): a queue of its own with a rate of [`COUNT`] starts per
//! [`PER`], served by every `relayq work` process of the run under its faults
//! (SIGKILLs, SIGSTOPs past the lease, server crashes and restarts), holding [`JOBS`]
//! short commands from the start.
//!
//! Checked at the end from the database: each attempt's claim, on the server's clock,
//! counted in every window of [`PER`]; more than [`COUNT`] in one is a violation, and
//! so is a job not finished. A rate bounds claims, not command starts: a job claimed
//! ahead may start later in its worker, so the ledger's start lines are not what the
//! rate bounds. An attempt whose claim the server forgot in a crash is not in the log
//! and is not counted.

use std::time::Duration;

use chrono::TimeDelta;
use relayq::{Backend, JobId, JobState, NewJob, QueueUpdate, Rate};

use crate::{check::Check, run::queue};

/// Starts per window.
pub const COUNT: u32 = 10;
/// The window.
pub const PER: Duration = Duration::from_secs(1);
/// The cell's jobs: four windows' worth.
const JOBS: usize = 40;

/// The check's name.
pub const NAME: &str = "rate: claims within rate";

/// The cell of one run: its queue and jobs, or none when the backend keeps no rates.
pub struct Cell {
    /// The queue the workers must serve.
    pub queue: String,
    ids: Vec<JobId>,
}

/// Sets the cell's rate and enqueues its jobs.
///
/// # Errors
/// When the backend refuses them for a minute.
pub async fn start(backend: &dyn Backend) -> anyhow::Result<Cell> {
    let q = format!("{}.rate", queue());
    if !backend.limits().rates {
        return Ok(Cell {
            queue: q,
            ids: Vec::new(),
        });
    }
    let rate = Rate::new(COUNT, PER);
    crate::run::retry("set the cell's rate", || {
        backend.update_queue(&q, QueueUpdate::default().rate(Some(rate)))
    })
    .await?;
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| {
            let payload = serde_json::json!({"command": "true", "name": format!("rate-{i}")});
            NewJob::new(&q, payload.to_string().into_bytes()).max_attempts(25)
        })
        .collect();
    let got =
        crate::run::retry("enqueue the cell's jobs", || backend.enqueue(jobs.clone())).await?;
    Ok(Cell {
        queue: q,
        ids: got.into_iter().map(|e| e.id).collect(),
    })
}

impl Cell {
    /// Whether every job of the cell has finished (the run waits for them).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn finished(&self, backend: &dyn Backend) -> anyhow::Result<bool> {
        let stats = backend.queue_stats(&self.queue).await?;
        Ok(stats.total() == stats.count(JobState::Succeeded) + stats.count(JobState::Dead))
    }

    /// Checks the claims of the cell's attempts against the rate, once the workers
    /// have stopped.
    ///
    /// # Errors
    /// When the database cannot be read for a minute.
    pub async fn check(&self, backend: &dyn Backend) -> anyhow::Result<(Check, String)> {
        let mut check = Check::new(NAME, 0);
        if self.ids.is_empty() {
            return Ok((check, "not run: the backend keeps no rates".into()));
        }
        let mut claims = Vec::new();
        for &id in &self.ids {
            let info = crate::run::retry("job", || backend.job(&self.queue, id)).await?;
            if info.state != JobState::Succeeded {
                check
                    .violations
                    .push(format!("job {id} ended {} (want succeeded)", info.state));
            }
            claims.extend(info.attempt_log.iter().map(relayq::AttemptRecord::claimed));
        }
        claims.sort_unstable();
        check.checked = claims.len();
        let window = TimeDelta::from_std(PER)?;
        let mut worst = 0;
        for (i, &t) in claims.iter().enumerate() {
            let within = claims[i..].iter().take_while(|&&c| c < t + window).count();
            worst = worst.max(within);
            if within > COUNT as usize && check.violations.len() < 5 {
                check.violations.push(format!(
                    "{within} claims in the {PER:?} from {t} under a rate of {COUNT}/{PER:?}"
                ));
            }
        }
        let span = match (claims.first(), claims.last()) {
            (Some(a), Some(b)) => (*b - *a).as_seconds_f64(),
            _ => 0.0,
        };
        let note = format!(
            "{} claims of {} jobs over {span:.1} s; at most {worst} in any {PER:?} (rate {COUNT}/{PER:?})",
            claims.len(),
            self.ids.len()
        );
        Ok((check, note))
    }
}
