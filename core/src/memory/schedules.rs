//! SPEC S on the in-memory store: a schedule's mark moves and its slot's jobs are
//! stored under the one lock, so nothing sees one without the other.

use chrono::{DateTime, Utc};

use super::store::QueueState;
use crate::{
    Error, EventKind, Result, Schedules, async_trait,
    schedule::{Fire, Fired, StoredSchedule},
};

use super::MemoryBackend;

impl QueueState {
    fn put_schedule(
        &mut self,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) {
        if let Some(s) = self.schedules.get_mut(name) {
            definition.clone_into(&mut s.definition);
            s.version += 1;
            return;
        }
        self.schedules.insert(
            name.to_owned(),
            StoredSchedule {
                name: name.to_owned(),
                definition: definition.to_owned(),
                version: 1,
                mark: starting.unwrap_or(now),
                paused: false,
                last_slot: None,
                last_job: None,
                last_batch: None,
            },
        );
    }

    fn fire(&mut self, mut fire: Fire, now: DateTime<Utc>) -> Result<Fired> {
        let Some(s) = self.schedules.get(&fire.name) else {
            return Ok(Fired::Gone);
        };
        if let Some(no) = crate::kit::fire::refusal(&fire, s.version, s.mark, s.paused, now) {
            return Ok(no);
        }
        let asked = !fire.jobs.is_empty();
        let batch = match (fire.batch, fire.jobs.is_empty()) {
            (Some(on_failure), false) => {
                let batch = crate::NewBatch::new(String::new())
                    .on_failure(on_failure)
                    .name(fire.name.clone());
                Some(self.open_batch(&batch, now))
            }
            _ => None,
        };
        for job in &mut fire.jobs {
            job.batch = batch;
        }
        let jobs = self.enqueue(fire.jobs, now)?;
        if let Some(b) = batch {
            self.seal(b, &fire.queue)?;
        }
        let made = Fired::Made { batch, jobs };
        if let Some(slot) = fire.slot {
            let s = self.schedules.get_mut(&fire.name).expect("checked");
            s.mark = slot;
            if let (true, Some((batch, job))) = (asked, made.made()) {
                s.last_slot = Some(slot);
                s.last_batch = batch;
                s.last_job = job;
            }
        }
        Ok(made)
    }
}

#[async_trait]
impl Schedules for MemoryBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.with_queue(queue, |q, now| {
            q.put_schedule(name, definition, starting, now);
        })
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        self.with_queue(queue, |q, now| {
            (q.schedules.values().cloned().collect(), now)
        })
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        self.with_queue(queue, |q, _| q.schedules.remove(name).is_some())
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        self.with_queue(queue, |q, _| match q.schedules.get_mut(name) {
            Some(s) => {
                s.paused = paused;
                Ok(())
            }
            None => Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            ))),
        })?
    }

    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired> {
        let queue = fire.queue.clone();
        let fired = self.with_queue(&queue, |q, now| q.fire(fire, now))??;
        if matches!(&fired, Fired::Made { jobs, .. } if !jobs.is_empty()) {
            self.notify(&queue, EventKind::Ready);
        }
        Ok(fired)
    }
}
