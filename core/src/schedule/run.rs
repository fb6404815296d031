//! A scheduler's pass over one queue's schedules, and "run now" (SPEC S2, S5).

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};

use super::{
    Definition, Fire, Fired, ScheduleInfo, StoredSchedule, Timetable,
    due::{Due, due},
};
use crate::{Error, NewJob, Result, Schedules, validate};

/// Most slots one pass fires or passes over per schedule; a pass that stops here
/// says the queue is due again at once.
const MAX_STEPS: usize = 64;

/// What one pass over a queue's schedules did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Tick {
    /// The slots this pass fired: schedule, slot, and what the backend made.
    pub fired: Vec<(String, DateTime<Utc>, Fired)>,
    /// The earliest next slot of the queue's running schedules; `None` when none
    /// will come.
    pub next: Option<DateTime<Utc>>,
    /// The server's time the pass judged by.
    pub now: Option<DateTime<Utc>>,
}

impl Tick {
    /// How long a scheduler may sleep before its next pass, at most `cap`.
    #[must_use]
    pub fn sleep(&self, cap: std::time::Duration) -> std::time::Duration {
        match (self.next, self.now) {
            (Some(next), Some(now)) => (next - now).to_std().unwrap_or_default().min(cap),
            _ => cap,
        }
    }
}

/// Fires every slot of `queue`'s schedules that is due by the server's time, each at
/// most once however many schedulers run this at once (SPEC S2, S3).
///
/// # Errors
/// The backend's errors; [`Error::InvalidInput`] on `queue` for a bad name.
pub async fn run_due<B: Schedules + ?Sized>(b: &B, queue: &str) -> Result<Tick> {
    run_due_with(b, queue, &mut Memo::default()).await
}

/// What a scheduler keeps between its passes: each schedule's definition read and its
/// next slot, so that a pass over schedules none of which is due reads their rows and
/// parses nothing (an idle worker passes once a second).
#[derive(Debug, Default)]
pub struct Memo {
    seen: HashMap<(String, String), Seen>,
}

#[derive(Debug)]
struct Seen {
    version: i64,
    text: String,
    def: Definition,
    table: Timetable,
    /// The mark the next slot below was worked out from.
    mark: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
}

/// [`run_due`], keeping what it read in `memo` for the next pass.
///
/// # Errors
/// As [`run_due`].
pub async fn run_due_with<B: Schedules + ?Sized>(
    b: &B,
    queue: &str,
    memo: &mut Memo,
) -> Result<Tick> {
    validate::queue_name(queue)?;
    let (rows, now) = b.stored_schedules_unchecked(queue).await?;
    let mut tick = Tick {
        now: Some(now),
        ..Tick::default()
    };
    memo.seen
        .retain(|(q, name), _| q != queue || rows.iter().any(|r| &r.name == name));
    let mut rows: Vec<StoredSchedule> = rows.into_iter().filter(|r| !r.paused).collect();
    // Schedulers that start at the same moment would otherwise walk the schedules in
    // the same order and meet at every one: each starts at a random place instead.
    if !rows.is_empty() {
        let start = fastrand::usize(..rows.len());
        rows.rotate_left(start);
    }
    for row in rows {
        let key = (queue.to_owned(), row.name.clone());
        let known = memo
            .seen
            .get(&key)
            .is_some_and(|s| s.version == row.version && s.text == row.definition);
        if !known {
            let Some((def, table)) = read(&row) else {
                continue;
            };
            memo.seen.insert(
                key.clone(),
                Seen {
                    version: row.version,
                    text: row.definition.clone(),
                    def,
                    table,
                    mark: row.mark,
                    next: None,
                },
            );
        }
        let seen = memo.seen.get_mut(&key).expect("inserted above");
        if let (true, Some(next)) = (seen.mark == row.mark, seen.next)
            && next > now
        {
            tick.next = earliest(tick.next, Some(next));
            continue;
        }
        let mut mark = row.mark;
        let mut steps = 0;
        loop {
            if steps == MAX_STEPS {
                tick.next = Some(now);
                break;
            }
            steps += 1;
            let (slot, jobs) = match due(&seen.table, mark, now, seen.def.missed) {
                Due::Wait(next) => {
                    tick.next = earliest(tick.next, next);
                    seen.mark = mark;
                    seen.next = next;
                    break;
                }
                Due::Fire(slot) => (slot, jobs_of(queue, &row.name, &seen.def)),
                Due::Skip(slot) => (slot, Vec::new()),
            };
            let fired_any = !jobs.is_empty();
            let fired = b
                .fire_unchecked(Fire {
                    queue: queue.to_owned(),
                    name: row.name.clone(),
                    version: row.version,
                    slot: Some(slot),
                    jobs,
                    batch: seen.def.batch,
                })
                .await
                .map_err(|e| e.during("fire"))?;
            if !matches!(fired, Fired::Made { .. }) {
                // Another scheduler moved on, or the schedule changed: the next pass
                // reads it again.
                tick.next = earliest(tick.next, Some(now + TimeDelta::seconds(1)));
                seen.next = None;
                break;
            }
            mark = slot;
            if fired_any {
                tick.fired.push((row.name.clone(), slot, fired));
            }
        }
    }
    Ok(tick)
}

/// Enqueues one slot's jobs of schedule `name` now, outside its timetable: no mark
/// moves and a pause is ignored (SPEC S5).
pub(crate) async fn run_now<B: Schedules + ?Sized>(
    b: &B,
    queue: &str,
    name: &str,
) -> Result<Fired> {
    let (rows, _) = b.stored_schedules_unchecked(queue).await?;
    let Some(row) = rows.into_iter().find(|r| r.name == name) else {
        return Err(Error::not_found(format!(
            "schedule {name:?} in queue {queue:?}"
        )));
    };
    let Some((def, _)) = read(&row) else {
        return Err(Error::invalid(
            "schedule",
            format!("schedule {name:?} was stored by a newer relayq and cannot be read"),
        ));
    };
    b.fire_unchecked(Fire {
        queue: queue.to_owned(),
        name: row.name.clone(),
        version: row.version,
        slot: None,
        jobs: jobs_of(queue, &row.name, &def),
        batch: def.batch,
    })
    .await
    .map_err(|e| e.during("run_now"))
}

/// The listing's view of a stored schedule, with its next slot after `now`.
pub(crate) fn decode(queue: &str, row: StoredSchedule, now: DateTime<Utc>) -> ScheduleInfo {
    let read = read(&row);
    let next_slot = match (&read, row.paused) {
        (Some((def, table)), false) => match due(table, row.mark, now, def.missed) {
            Due::Wait(next) => next,
            Due::Fire(slot) => Some(slot),
            Due::Skip(_) => table.next_after(now),
        },
        _ => None,
    };
    ScheduleInfo {
        queue: queue.to_owned(),
        name: row.name,
        definition: read.map(|(d, _)| d),
        version: row.version,
        paused: row.paused,
        mark: row.mark,
        last_slot: row.last_slot,
        last_job: row.last_job,
        last_batch: row.last_batch,
        next_slot,
    }
}

fn read(row: &StoredSchedule) -> Option<(Definition, Timetable)> {
    let def: Definition = match serde_json::from_str(&row.definition) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(schedule = %row.name, error = %e, "a stored schedule does not read; skipped");
            return None;
        }
    };
    match Timetable::new(&def.cron, &def.time_zone) {
        Ok(t) => Some((def, t)),
        Err(e) => {
            tracing::warn!(schedule = %row.name, error = %e, "a stored schedule does not read; skipped");
            None
        }
    }
}

fn jobs_of(queue: &str, name: &str, def: &Definition) -> Vec<NewJob> {
    def.jobs
        .iter()
        .map(|j| j.to_new_job(queue, name, def.batch.is_some()))
        .collect()
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use chrono::TimeZone;

    use super::*;
    use crate::{
        Inspect, Limits, NewJob,
        memory::{ManualClock, MemoryBackend},
        schedule::Schedule,
    };

    fn at_noon() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap()
    }

    fn backend() -> (MemoryBackend, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(at_noon()));
        (MemoryBackend::with(clock.clone(), Limits::default()), clock)
    }

    /// How many slots one pass of queue `q` fired.
    async fn fired(b: &MemoryBackend, memo: &mut Memo) -> usize {
        run_due_with(b, "q", memo).await.unwrap().fired.len()
    }

    /// SPEC S2, S5: a scheduler that keeps its memo between passes fires each slot as
    /// it comes, nothing twice, and reads a replaced definition at once though the
    /// memo said the old one's next slot was far away.
    #[tokio::test]
    async fn a_memo_fires_each_slot_once_and_sees_a_replacement() {
        let (b, clock) = backend();
        let job = || NewJob::new("q", b"x".to_vec());
        b.put_schedule(&Schedule::new("q", "s", "* * * * * *").job(job()))
            .await
            .unwrap();
        let mut memo = Memo::default();
        clock.advance(Duration::from_secs(1));
        assert_eq!(fired(&b, &mut memo).await, 1);
        assert_eq!(fired(&b, &mut memo).await, 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(fired(&b, &mut memo).await, 1);

        // Yearly: the memo learns its next slot is months away.
        b.put_schedule(&Schedule::new("q", "s", "0 0 1 1 *").job(job()))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
        assert_eq!(fired(&b, &mut memo).await, 0);
        // Back to every second: the new version is read, not the memo's next slot.
        b.put_schedule(&Schedule::new("q", "s", "* * * * * *").job(job()))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
        let tick = run_due_with(&b, "q", &mut memo).await.unwrap();
        assert_eq!(tick.fired.len(), 1, "{:?}", tick.fired);
        assert_eq!(b.queue_stats("q").await.unwrap().total(), 3);
    }

    /// SPEC S2: slots are judged by the backend's clock alone; a pass never fires a
    /// slot the backend's time has not reached, whatever this process's clock says.
    #[tokio::test]
    async fn slots_follow_the_backends_clock() {
        let (b, clock) = backend();
        b.put_schedule(&Schedule::new("q", "s", "* * * * * *").job(NewJob::new("q", vec![])))
            .await
            .unwrap();
        // The backend stands in 2026 while this process's clock is far later.
        let tick = run_due(&b, "q").await.unwrap();
        assert!(tick.fired.is_empty(), "{:?}", tick.fired);
        assert_eq!(tick.next, Some(at_noon() + TimeDelta::seconds(1)));
        clock.advance(Duration::from_secs(3));
        let tick = run_due(&b, "q").await.unwrap();
        assert_eq!(tick.fired[0].1, at_noon() + TimeDelta::seconds(3), "latest");
    }
}
