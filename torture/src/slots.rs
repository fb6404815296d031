//! The schedule cell (SPEC S2, S3): a per-second schedule in a queue of its own, fired
//! by every `relayq work` process of the run (three of the four by default, the fourth
//! being the library worker) while the faults go on: SIGKILLs, SIGSTOPs past the
//! lease, server crashes and restarts, cut connections. Every slot from the schedule's
//! start to its last one must be enqueued exactly once: its policy catches up every
//! slot of the last hour, so none may be missing, and none may be there twice.
//!
//! A scheduler's own clock is never read: slots are judged by the server's time, so a
//! process with a skewed clock fires the same slots (the fire is refused in the
//! backend when a slot lies in the server's future).

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use relayq::{
    Backend, NewJob,
    schedule::{Missed, Schedule},
};

use crate::{check::Check, run::queue};

/// The schedule's name.
const NAME: &str = "tick";
/// How far behind the server's time the last slot may be when the workers stop.
const BEHIND: TimeDelta = TimeDelta::seconds(10);

/// The cell of one run: its queue, and the mark the schedule started from.
pub struct Cell {
    /// The queue the schedule and its jobs live in.
    pub queue: String,
    start: DateTime<Utc>,
}

/// Stores the schedule; the workers fire it from then on.
///
/// # Errors
/// When the backend refuses it for a minute.
pub async fn start(backend: &dyn Backend) -> anyhow::Result<Cell> {
    let q = format!("{}.schedule", queue());
    let payload = serde_json::json!({"command": "true", "name": NAME, "env": {"LC_ALL": "C"}});
    let s = Schedule::new(&q, NAME, "* * * * * *")
        .missed(Missed::all_within(Duration::from_secs(3600)))
        .job(NewJob::new(&q, payload.to_string().into_bytes()));
    crate::run::retry("put_schedule", || backend.put_schedule(&s)).await?;
    let (start, _) = read(backend, &q).await?;
    Ok(Cell { queue: q, start })
}

/// The schedule's mark and the server's time.
async fn read(backend: &dyn Backend, q: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let (rows, now) =
        crate::run::retry("schedules", || backend.stored_schedules_unchecked(q)).await?;
    let row = rows
        .into_iter()
        .find(|r| r.name == NAME)
        .ok_or_else(|| anyhow::anyhow!("the schedule of {q} is gone"))?;
    Ok((row.mark, now))
}

impl Cell {
    /// The server's time, read just before the workers are told to stop.
    ///
    /// # Errors
    /// When the backend cannot be read for a minute.
    pub async fn stopping(&self, backend: &dyn Backend) -> anyhow::Result<DateTime<Utc>> {
        Ok(read(backend, &self.queue).await?.1)
    }

    /// Checks, after the workers stopped, that every slot from the start to the mark
    /// has one job, and that the mark kept up until `stopping`.
    ///
    /// # Errors
    /// When the backend cannot be read for a minute.
    pub async fn check(
        &self,
        backend: &dyn Backend,
        stopping: DateTime<Utc>,
    ) -> anyhow::Result<Check> {
        let (mark, _) = read(backend, &self.queue).await?;
        // Per-second slots after the start, up to the mark: whole seconds.
        let slots = mark.timestamp() - self.start.timestamp();
        let stats = crate::run::retry("queue_stats", || backend.queue_stats(&self.queue)).await?;
        let jobs = stats.total();
        let mut violations = Vec::new();
        if i64::try_from(jobs).unwrap_or(i64::MAX) != slots {
            violations.push(format!(
                "{jobs} jobs stored for the {slots} slots from {} to {mark}",
                self.start
            ));
        }
        if mark < stopping - BEHIND {
            violations.push(format!(
                "the last slot fired was {mark}, {} s before the workers were stopped",
                (stopping - mark).num_seconds()
            ));
        }
        Ok(Check {
            name: "schedule: each slot enqueued once",
            checked: usize::try_from(slots).unwrap_or(0),
            violations,
            excused: Vec::new(),
        })
    }
}
