//! Who may run now: the SPEC's stage and group rules computed directly from the jobs.
//!
//! The memory backend is the reference model, so it derives eligibility from scratch on
//! every look instead of maintaining promoted state: slower, but obviously right.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::store::{Job, Phase, QueueState};
use crate::JobState;

/// Order key of SPEC "Words": `(priority, run_at, id)`.
pub(crate) type OrderKey = (i16, DateTime<Utc>, i64);

/// Eligibility facts of one queue at one instant.
pub(crate) struct View<'a> {
    q: &'a QueueState,
    now: DateTime<Utc>,
    /// Per batch: the lowest stage that still has unfinished jobs (SPEC B2).
    stage_floor: HashMap<i64, i32>,
    /// Per group: the job running or retrying, which holds the group (SPEC G1).
    holder: HashMap<&'a str, i64>,
    /// Per group: the earliest unfinished job whose stage is released and whose
    /// dependencies finished (SPEC G2, G4, D2).
    head: HashMap<&'a str, OrderKey>,
}

impl<'a> View<'a> {
    pub(crate) fn new(q: &'a QueueState, now: DateTime<Utc>) -> Self {
        let mut stage_floor: HashMap<i64, i32> = HashMap::new();
        for job in q.open_jobs() {
            if let (Some(b), Some(s)) = (job.batch, job.stage) {
                let floor = stage_floor.entry(b).or_insert(s);
                *floor = (*floor).min(s);
            }
        }
        let mut view = Self {
            q,
            now,
            stage_floor,
            holder: HashMap::new(),
            head: HashMap::new(),
        };
        for job in q.open_jobs() {
            let Some(group) = job.group.as_deref() else {
                continue;
            };
            if matches!(job.phase, Phase::Running { .. } | Phase::Retrying) {
                view.holder.insert(group, job.id);
            }
            if view.stage_released(job) && view.after_done(job) {
                let key = job.order_key();
                view.head
                    .entry(group)
                    .and_modify(|k| *k = (*k).min(key))
                    .or_insert(key);
            }
        }
        view
    }

    /// No unfinished job of the batch has a lower stage (SPEC B2).
    fn stage_released(&self, job: &Job) -> bool {
        match (job.batch, job.stage) {
            (Some(b), Some(s)) => self.stage_floor.get(&b).is_none_or(|floor| s <= *floor),
            _ => true,
        }
    }

    /// Every job it runs after finished (SPEC D2): one that failed under the `Cancel`
    /// policy cancelled it already, so what is left counts as done. A job pruned away
    /// had finished.
    fn after_done(&self, job: &Job) -> bool {
        job.after.iter().all(|p| {
            self.q
                .job(*p)
                .is_none_or(|p| matches!(p.phase, Phase::Finished(_)))
        })
    }

    /// The group lets this job start: nobody holds it and the job is its head.
    fn group_free_for(&self, job: &Job) -> bool {
        let Some(group) = job.group.as_deref() else {
            return true;
        };
        match self.holder.get(group) {
            Some(holder) => *holder == job.id,
            None => self.head.get(group) == Some(&job.order_key()),
        }
    }

    /// The state a caller sees for an unfinished job.
    pub(crate) fn state(&self, job: &Job) -> JobState {
        match job.phase {
            Phase::Running { .. } => JobState::Running,
            Phase::Retrying => JobState::Retrying,
            Phase::Waiting
                if !(self.stage_released(job)
                    && self.after_done(job)
                    && self.group_free_for(job)) =>
            {
                JobState::Blocked
            }
            Phase::Waiting if job.run_at > self.now => JobState::Scheduled,
            Phase::Waiting => JobState::Ready,
            Phase::Finished(state) => state,
        }
    }

    /// Whether a claim may take the job now.
    pub(crate) fn claimable(&self, job: &Job) -> bool {
        match job.phase {
            Phase::Waiting => self.state(job) == JobState::Ready,
            // A retrying job holds its group and its stage; it only waits for its time.
            Phase::Retrying => job.run_at <= self.now,
            Phase::Running { .. } | Phase::Finished(_) => false,
        }
    }
}
