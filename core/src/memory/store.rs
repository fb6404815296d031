//! The memory backend's data and every state change, as plain synchronous functions of
//! "now". The caller holds the lock; nothing here awaits.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use super::view::{OrderKey, View};
use crate::kit::keys::{Admit, KeyAdmission, KeyInfo};
use crate::{
    AttemptOutcome, AttemptRecord, BatchId, BatchProgress, ClaimRequest, ClaimedJob, Enqueued,
    Error, JobId, JobInfo, JobState, Lease, LeaseToken, NewJob, OnFailure, Outcome, Progress,
    ProgressReport, QueueStats, Result, RunningJob, Settle, Settled, StageProgress,
};

/// Where a job is in its life, as stored. Ready, scheduled and blocked are all
/// `Waiting`; which one a caller sees is derived by [`View`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    Waiting,
    Running {
        token: LeaseToken,
        expires_at: DateTime<Utc>,
        worker: String,
    },
    Retrying,
    Finished(JobState),
}

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) id: i64,
    payload: Vec<u8>,
    priority: i16,
    pub(crate) run_at: DateTime<Utc>,
    max_attempts: u16,
    /// Attempts counted so far; a claim adds one, a release takes it back.
    attempts: u32,
    /// The attempts it was enqueued with, kept once a dead retry grows
    /// `max_attempts` (SPEC M2).
    budget: Option<u16>,
    pub(crate) group: Option<String>,
    pub(crate) batch: Option<i64>,
    pub(crate) stage: Option<i32>,
    dedupe_key: Option<String>,
    enqueued_by: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    log: Vec<AttemptRecord>,
    progress: Option<Progress>,
    limit_key: Option<String>,
    /// The jobs it runs after (SPEC D1), and what it does when one fails (D4).
    pub(crate) after: Vec<i64>,
    after_failure: crate::AfterFailure,
    pub(crate) phase: Phase,
}

impl Job {
    pub(crate) fn order_key(&self) -> OrderKey {
        (self.priority, self.run_at, self.id)
    }

    /// Closes the open attempt of the execution log (SPEC L5).
    fn close_attempt(
        &mut self,
        now: DateTime<Utc>,
        outcome: AttemptOutcome,
        error: Option<&str>,
        output: Option<&str>,
    ) {
        if let Some(rec) = self.log.last_mut().filter(|r| r.ended_at.is_none()) {
            rec.ended_at = Some(now);
            rec.outcome = outcome;
            rec.error = error.map(str::to_owned);
            rec.output = output.map(str::to_owned);
        }
    }

    /// Attempts spent before its last dead retry (SPEC M2): `max_attempts` less the
    /// budget it grew by, 0 for a job never retried from dead.
    fn spent_before_retry(&self) -> u32 {
        self.budget
            .map_or(0, |b| u32::from(self.max_attempts.saturating_sub(b)))
    }

    /// The lease fields when `lease` still holds this job: same token, not expired.
    fn holds(&self, lease: &Lease, now: DateTime<Utc>) -> bool {
        matches!(&self.phase, Phase::Running { token, expires_at, .. }
            if *token == lease.token && *expires_at > now)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BatchState {
    name: Option<String>,
    created_at: DateTime<Utc>,
    on_failure: OnFailure,
    after_failure: crate::AfterFailure,
    sealed: bool,
    failed: bool,
    /// High-water mark of released stages (SPEC B3).
    released: Option<i32>,
}

#[derive(Debug, Default)]
pub(crate) struct QueueState {
    next_id: i64,
    next_batch: i64,
    jobs: BTreeMap<i64, Job>,
    /// Ids of unfinished jobs.
    open: BTreeSet<i64>,
    /// Dedupe key → unfinished job holding it (SPEC E3).
    dedupe: HashMap<String, i64>,
    pub(crate) paused: bool,
    pub(crate) max_running: Option<u32>,
    /// The limit of every key without one of its own (SPEC K1).
    pub(crate) key_default: Option<u32>,
    /// Keys' own limits.
    pub(crate) key_own: BTreeMap<String, u32>,
    /// The queue's rate (SPEC K8) and the time of its next start, in microseconds
    /// (`kit::rate`).
    pub(crate) rate: Option<crate::Rate>,
    pub(crate) rate_tat: Option<i64>,
    /// The rate of every key without one of its own, keys' own rates, and each rated
    /// key's next start in microseconds (SPEC K12).
    pub(crate) key_rate_default: Option<crate::Rate>,
    pub(crate) key_rate_own: BTreeMap<String, crate::Rate>,
    pub(crate) key_tat: HashMap<String, i64>,
    batches: BTreeMap<i64, BatchState>,
    /// Schedules by name (SPEC S).
    pub(crate) schedules: BTreeMap<String, crate::schedule::StoredSchedule>,
    /// Set when a halt cancelled a running job, for the backend to send `Revoked`
    /// (SPEC B8) once the call that did it returns.
    pub(crate) revoked: bool,
    /// Each worker's last beat and when it came (SPEC M9).
    pub(crate) workers: BTreeMap<String, (crate::WorkerBeat, DateTime<Utc>)>,
}

/// A dead retry's new `max_attempts`: the attempts spent plus the enqueued budget, at
/// most `i16::MAX`, the SQL backends' column type (SPEC M2).
pub(crate) fn grown_budget(attempts: u32, budget: u16) -> u16 {
    let cap = i16::MAX.unsigned_abs();
    u16::try_from(attempts.saturating_add(u32::from(budget))).map_or(cap, |m| m.min(cap))
}

fn after(now: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    now + TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

impl QueueState {
    /// Whether the queue ever held a job or a batch, or has a setting (SPEC M4): the
    /// store makes a state for every queue named, even one only looked at.
    pub(crate) fn in_use(&self) -> bool {
        self.next_id > 0
            || self.next_batch > 0
            || self.paused
            || self.max_running.is_some()
            || self.rate.is_some()
            || self.key_default.is_some()
            || !self.key_own.is_empty()
            || self.key_rate_default.is_some()
            || !self.key_rate_own.is_empty()
            || !self.schedules.is_empty()
    }

    pub(crate) fn job(&self, id: i64) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub(crate) fn open_jobs(&self) -> impl Iterator<Item = &Job> {
        self.open.iter().map(|id| &self.jobs[id])
    }

    fn batch(&self, id: BatchId, queue: &str) -> Result<&BatchState> {
        self.batches
            .get(&id.0)
            .ok_or_else(|| Error::not_found(format!("batch {id} in queue {queue:?}")))
    }

    /// SPEC E1–E4, B3, D1–D5: checks everything first, then stores all jobs.
    pub(crate) fn enqueue(
        &mut self,
        jobs: Vec<NewJob>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            let Some(b) = job.batch else { continue };
            let batch = self.batches.get(&b.0).ok_or_else(|| {
                Error::invalid("batch", format!("batch {b} is unknown in this queue"))
            })?;
            if batch.sealed {
                return Err(Error::invalid("batch", format!("batch {b} is sealed")));
            }
            if batch.failed {
                return Err(Error::invalid(
                    "batch",
                    format!("batch {b} halted after a dead job"),
                ));
            }
            let stage = job.stage.unwrap_or(0);
            if let Some(released) = batch.released.filter(|r| stage < *r) {
                return Err(Error::StageClosed { stage, released });
            }
            for dep in &job.after {
                if let crate::After::Job(id) = dep {
                    let parent = self.jobs.get(&id.0).map(|p| (p.batch, p.stage));
                    crate::kit::after::check_stored(*id, parent, b.0, stage)?;
                }
            }
        }
        let mut out = Vec::with_capacity(jobs.len());
        let mut touched = BTreeSet::new();
        let mut jobs = jobs;
        let after: Vec<Vec<crate::After>> = jobs
            .iter_mut()
            .map(|j| std::mem::take(&mut j.after))
            .collect();
        for new in jobs {
            if let Some(existing) = new.dedupe_key.as_ref().and_then(|k| self.dedupe.get(k)) {
                out.push(Enqueued {
                    id: JobId(*existing),
                    deduplicated: true,
                });
                continue;
            }
            self.next_id += 1;
            let id = self.next_id;
            if let Some(key) = &new.dedupe_key {
                self.dedupe.insert(key.clone(), id);
            }
            let after_failure = new
                .batch
                .and_then(|b| self.batches.get(&b.0))
                .map_or(new.after_failure.unwrap_or_default(), |b| {
                    new.after_failure.unwrap_or(b.after_failure)
                });
            if let Some(b) = new.batch {
                touched.insert(b.0);
            }
            self.jobs.insert(
                id,
                Job {
                    id,
                    run_at: new.run_at.resolve(now),
                    stage: new.batch.map(|_| new.stage.unwrap_or(0)),
                    batch: new.batch.map(|b| b.0),
                    payload: new.payload,
                    priority: new.priority,
                    max_attempts: new.max_attempts,
                    attempts: 0,
                    budget: None,
                    group: new.group,
                    dedupe_key: new.dedupe_key,
                    enqueued_by: new.enqueued_by,
                    created_at: now,
                    finished_at: None,
                    last_error: None,
                    log: Vec::new(),
                    progress: None,
                    limit_key: new.limit_key,
                    after: Vec::new(),
                    after_failure,
                    phase: Phase::Waiting,
                },
            );
            self.open.insert(id);
            out.push(Enqueued {
                id: JobId(id),
                deduplicated: false,
            });
        }
        // The call's own edges, now that every job of it has its id; then a job whose
        // dependency already failed follows its policy at once (SPEC D4).
        let mut failed = Vec::new();
        for (child, parent) in crate::kit::after::edges(after.iter().map(Vec::as_slice), &out) {
            if let Some(Phase::Finished(st @ (JobState::Dead | JobState::Cancelled))) =
                self.jobs.get(&parent.0).map(|j| &j.phase)
            {
                failed.push((parent.0, *st));
            }
            let job = self.jobs.get_mut(&child.0).expect("stored above");
            job.after.push(parent.0);
        }
        for (parent, state) in failed {
            self.after_failed(parent, state, now);
        }
        for b in touched {
            self.bump_released(b);
        }
        Ok(out)
    }

    /// SPEC D4: `parent` ended dead or cancelled; every unfinished job that runs after
    /// it and keeps the `Cancel` policy is cancelled, and so on down the graph. Those
    /// jobs never started: a job starts only once all it runs after finished.
    fn after_failed(&mut self, parent: i64, state: JobState, now: DateTime<Utc>) {
        let mut failed = vec![(parent, state)];
        while let Some((parent, state)) = failed.pop() {
            let children: Vec<i64> = self
                .open_jobs()
                .filter(|j| j.after.contains(&parent))
                .filter(|j| j.after_failure == crate::AfterFailure::Cancel)
                .map(|j| j.id)
                .collect();
            for child in children {
                if let Some(job) = self.jobs.get_mut(&child) {
                    job.last_error = Some(crate::cancelled_by::after(JobId(parent), state));
                }
                self.mark_finished(child, JobState::Cancelled, now);
                failed.push((child, JobState::Cancelled));
            }
        }
    }

    /// Raises the batch's released high-water mark to its lowest unfinished stage.
    fn bump_released(&mut self, batch: i64) {
        let floor = self
            .open_jobs()
            .filter(|j| j.batch == Some(batch))
            .filter_map(|j| j.stage)
            .min();
        if let (Some(floor), Some(b)) = (floor, self.batches.get_mut(&batch)) {
            b.released = Some(b.released.map_or(floor, |r| r.max(floor)));
        }
    }

    /// Marks one job finished: phase, time, open set and dedupe key.
    fn mark_finished(&mut self, id: i64, state: JobState, now: DateTime<Utc>) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.phase = Phase::Finished(state);
        job.finished_at = Some(now);
        self.open.remove(&id);
        if let Some(key) = job.dedupe_key.clone()
            && self.dedupe.get(&key) == Some(&id)
        {
            self.dedupe.remove(&key);
        }
    }

    /// Moves a job to a finished state and applies what follows from it: dedupe key
    /// freed, batch high-water raised, and for a dead job in a `Halt` batch, every other
    /// unfinished job of the batch cancelled (SPEC B6); later stages never ran, so they
    /// do not count as released.
    fn finish(&mut self, id: i64, state: JobState, now: DateTime<Utc>) {
        self.mark_finished(id, state, now);
        if matches!(state, JobState::Dead | JobState::Cancelled) {
            self.after_failed(id, state, now);
        }
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let Some(batch) = job.batch else {
            return;
        };
        if state == JobState::Dead
            && let Some(b) = self
                .batches
                .get_mut(&batch)
                .filter(|b| b.on_failure == OnFailure::Halt)
        {
            b.failed = true;
            // Every unfinished job of the batch: later stages (not started) and the
            // rest of this stage, running ones included (their leases revoked, B8).
            let rest: Vec<i64> = self
                .open_jobs()
                .filter(|j| j.batch == Some(batch))
                .map(|j| j.id)
                .collect();
            for id in rest {
                if let Some(job) = self.jobs.get_mut(&id) {
                    self.revoked |= matches!(job.phase, Phase::Running { .. });
                    job.close_attempt(
                        now,
                        AttemptOutcome::Cancelled,
                        Some(crate::cancelled_by::HALT),
                        None,
                    );
                }
                self.mark_finished(id, JobState::Cancelled, now);
            }
        }
        self.bump_released(batch);
    }

    /// SPEC C5: expired leases end; the job retries in place or is dead.
    pub(crate) fn expire_leases(&mut self, now: DateTime<Utc>) -> (u64, u64) {
        let expired: Vec<i64> = self
            .open_jobs()
            .filter(|j| matches!(j.phase, Phase::Running { expires_at, .. } if expires_at <= now))
            .map(|j| j.id)
            .collect();
        let (mut requeued, mut dead) = (0, 0);
        for id in expired {
            let job = self.jobs.get_mut(&id).expect("open job exists");
            // A job dead earlier in this pass may have halted its batch, cancelling
            // this one: it stays cancelled (SPEC B6).
            if !matches!(job.phase, Phase::Running { .. }) {
                continue;
            }
            job.close_attempt(now, AttemptOutcome::Expired, Some("lease expired"), None);
            job.last_error = Some("lease expired".into());
            if job.attempts < u32::from(job.max_attempts) {
                // Keeps its run_at, so it keeps its place; still holds group and stage.
                job.phase = Phase::Retrying;
                requeued += 1;
            } else {
                self.finish(id, JobState::Dead, now);
                dead += 1;
            }
        }
        (requeued, dead)
    }

    /// The limit of `key` (SPEC K1).
    pub(crate) fn key_limit(&self, key: &str) -> Option<u32> {
        self.key_own.get(key).copied().or(self.key_default)
    }

    /// The rate of `key` (SPEC K12).
    pub(crate) fn key_rate(&self, key: &str) -> Option<crate::Rate> {
        self.key_rate_own
            .get(key)
            .copied()
            .or(self.key_rate_default)
    }

    /// Sets or lifts the rate of `key`, or of every key without its own (SPEC K12).
    /// A new rate starts afresh: a key's own for that key, the default for every key
    /// without its own; the same rate set again changes nothing.
    pub(crate) fn set_key_rate(&mut self, key: Option<&str>, rate: Option<crate::Rate>) {
        match key {
            None if rate != self.key_rate_default => {
                self.key_rate_default = rate;
                let own = &self.key_rate_own;
                self.key_tat.retain(|k, _| own.contains_key(k));
            }
            Some(k) if self.key_rate_own.get(k).copied() != rate => {
                match rate {
                    Some(r) => self.key_rate_own.insert(k.to_owned(), r),
                    None => self.key_rate_own.remove(k),
                };
                self.key_tat.remove(k);
            }
            _ => {}
        }
    }

    /// Running jobs of `key`, held ahead in a buffer included (SPEC K2).
    fn key_running(&self, key: &str) -> u64 {
        let n = self
            .open_jobs()
            .filter(|j| {
                matches!(j.phase, Phase::Running { .. }) && j.limit_key.as_deref() == Some(key)
            })
            .count();
        n as u64
    }

    /// SPEC K7.
    pub(crate) fn key_limits(&self, now: DateTime<Utc>) -> crate::KeyLimits {
        let mut running: BTreeMap<&str, u64> = BTreeMap::new();
        for j in self.open_jobs() {
            if let (Phase::Running { .. }, Some(k)) = (&j.phase, &j.limit_key) {
                *running.entry(k).or_default() += 1;
            }
        }
        for k in self.key_own.keys().chain(self.key_rate_own.keys()) {
            running.entry(k).or_default();
        }
        let now = now.timestamp_micros();
        let next = |k: &str| {
            let rate = self.key_rate(k)?;
            let at = crate::kit::rate::next_start(&rate, self.key_tat.get(k).copied(), now)?;
            DateTime::from_timestamp_micros(at)
        };
        for k in self.key_tat.keys() {
            if next(k).is_some() {
                running.entry(k).or_default();
            }
        }
        crate::KeyLimits {
            default: self.key_default,
            default_rate: self.key_rate_default,
            keys: running
                .into_iter()
                .take(crate::KEYS_LISTED)
                .map(|(k, n)| crate::KeyUse {
                    key: k.to_owned(),
                    running: n,
                    own: self.key_own.get(k).copied(),
                    limit: self.key_limit(k),
                    own_rate: self.key_rate_own.get(k).copied(),
                    rate: self.key_rate(k),
                    rate_next: next(k),
                })
                .collect(),
        }
    }

    fn running_count(&self) -> u32 {
        let n = self
            .open_jobs()
            .filter(|j| matches!(j.phase, Phase::Running { .. }))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// SPEC C1–C6 with groups and stages.
    pub(crate) fn claim(
        &mut self,
        queue: &str,
        req: &ClaimRequest,
        now: DateTime<Utc>,
    ) -> crate::Claimed {
        // A rate judges claims in whole microseconds; its jobs start at the time it
        // judged, so that every window it bounds is a window of their starts.
        let rated =
            self.rate.is_some() || self.key_rate_default.is_some() || !self.key_rate_own.is_empty();
        let now = if rated {
            now.duration_trunc(TimeDelta::microseconds(1))
                .unwrap_or(now)
        } else {
            now
        };
        self.expire_leases(now);
        if self.paused {
            return crate::Claimed::default();
        }
        let room = self
            .max_running
            .map_or(u32::MAX, |max| max.saturating_sub(self.running_count()));
        let asked = req.limit.min(room);
        if asked == 0 {
            return crate::Claimed::default();
        }
        // SPEC K9: the rate cuts the claim to what it allows now.
        let paced = self
            .rate
            .map(|r| crate::kit::rate::admit(&r, self.rate_tat, now.timestamp_micros(), asked));
        let take = paced.map_or(asked, |p| p.allowed) as usize;
        let mut candidates: Vec<OrderKey> = {
            let view = View::new(self, now);
            self.open_jobs()
                .filter(|j| view.claimable(j))
                .map(Job::order_key)
                .collect()
        };
        candidates.sort_unstable();
        // SPEC K2, K4, K6: a full key's jobs are passed over, not waited for.
        let now_us = now.timestamp_micros();
        let mut admission =
            KeyAdmission::new(u32::try_from(take).unwrap_or(u32::MAX), req.slots).at(now_us);
        let mut chosen = Vec::with_capacity(take);
        for c in candidates {
            if admission.done() {
                break;
            }
            let key = self.jobs[&c.2].limit_key.as_deref();
            let info = || {
                let k = key.unwrap_or_default();
                let limit = self.key_limit(k);
                KeyInfo {
                    limit,
                    running: if limit.is_some() {
                        self.key_running(k)
                    } else {
                        0
                    },
                    rate: self.key_rate(k),
                    tat: self.key_tat.get(k).copied(),
                }
            };
            if admission.decide(key, info) == Admit::Take {
                chosen.push(c);
            }
        }
        for change in admission.rated() {
            if let Some(tat) = change.tat {
                self.key_tat.insert(change.key, tat);
            }
        }
        let taken = u32::try_from(chosen.len()).unwrap_or(u32::MAX);
        // SPEC K13: when a key's rate held a job back and the claim is short, when to
        // claim again.
        let wake_in = admission
            .next_wake()
            .filter(|_| taken < u32::try_from(take).unwrap_or(u32::MAX))
            .map(|at| std::time::Duration::from_micros((at - now_us).max(0).unsigned_abs()));
        let expires_at = after(now, req.lease);
        let next_in = paced.and_then(|p| {
            if let Some(tat) = p.tat(taken) {
                self.rate_tat = Some(tat);
            }
            p.next_in(taken)
        });
        let jobs = chosen
            .into_iter()
            .map(|(_, _, id)| {
                let job = self.jobs.get_mut(&id).expect("open job exists");
                let token = LeaseToken::random();
                job.attempts += 1;
                job.phase = Phase::Running {
                    token,
                    expires_at,
                    worker: req.worker.clone(),
                };
                job.log.push(AttemptRecord {
                    attempt: job.attempts,
                    worker: req.worker.clone(),
                    started_at: now,
                    claimed_at: Some(now),
                    ended_at: None,
                    outcome: AttemptOutcome::Running,
                    error: None,
                    output: None,
                });
                ClaimedJob {
                    lease: Lease {
                        queue: queue.to_owned(),
                        job: JobId(id),
                        token,
                        attempt: job.attempts,
                        expires_at,
                        worker: req.worker.clone(),
                    },
                    payload: job.payload.clone(),
                    priority: job.priority,
                    run_at: job.run_at,
                    max_attempts: job.max_attempts,
                    group: job.group.clone(),
                    batch: job.batch.map(BatchId),
                    stage: job.stage,
                    enqueued_by: job.enqueued_by.clone(),
                }
            })
            .collect();
        crate::Claimed::new(jobs, next_in).waking_in(wake_in)
    }

    /// SPEC L1, L2, L4 for one lease.
    pub(crate) fn settle(&mut self, s: Settle, now: DateTime<Utc>) -> Result<Settled> {
        let id = s.lease.job.0;
        let job = self
            .jobs
            .get_mut(&id)
            .filter(|j| j.holds(&s.lease, now))
            .ok_or(Error::StaleLease)?;
        // The handler's start, if it waited in the worker after its claim (SPEC L5).
        if let (Some(waited), Some(rec)) = (s.waited, job.log.last_mut()) {
            rec.started_at = after(rec.started_at, waited).min(now);
        }
        match s.outcome {
            Outcome::Complete => {
                job.close_attempt(now, AttemptOutcome::Succeeded, None, s.output.as_deref());
                self.finish(id, JobState::Succeeded, now);
                Ok(Settled::Completed)
            }
            Outcome::Fail { error, retry } => {
                job.close_attempt(
                    now,
                    AttemptOutcome::Failed,
                    Some(&error),
                    s.output.as_deref(),
                );
                job.last_error = Some(error);
                let delay = retry.delay(job.attempts, now);
                match delay.filter(|_| job.attempts < u32::from(job.max_attempts)) {
                    Some(d) => {
                        job.phase = Phase::Retrying;
                        job.run_at = after(now, d);
                        Ok(Settled::Retrying { at: job.run_at })
                    }
                    None => {
                        self.finish(id, JobState::Dead, now);
                        Ok(Settled::Dead)
                    }
                }
            }
            Outcome::Release => {
                job.close_attempt(now, AttemptOutcome::Released, None, s.output.as_deref());
                job.attempts -= 1;
                // As before the claim: a job whose earlier attempt failed is retrying,
                // holding its group; its backoff moved its run_at behind later jobs of
                // the group, which must not overtake it (SPEC L4, G2). Attempts spent
                // before a dead retry do not count: it came back ready.
                job.phase = if job.attempts > job.spent_before_retry() {
                    Phase::Retrying
                } else {
                    Phase::Waiting
                };
                Ok(Settled::Released)
            }
        }
    }

    /// SPEC L3.
    pub(crate) fn heartbeat(
        &mut self,
        lease: &Lease,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>> {
        let job = self
            .jobs
            .get_mut(&lease.job.0)
            .filter(|j| j.holds(lease, now))
            .ok_or(Error::StaleLease)?;
        if let Phase::Running { expires_at, .. } = &mut job.phase {
            *expires_at = until;
        }
        Ok(until)
    }

    /// SPEC G2, M6: the job of `group` running or retrying, if one is.
    pub(crate) fn group_holder(&self, group: &str) -> Option<JobId> {
        self.open_jobs()
            .find(|j| {
                j.group.as_deref() == Some(group)
                    && matches!(j.phase, Phase::Running { .. } | Phase::Retrying)
            })
            .map(|j| JobId(j.id))
    }

    /// SPEC L7: stores the report's progress while its lease holds the job, expired or
    /// not; false when it does not.
    pub(crate) fn report_progress(&mut self, report: &ProgressReport) -> bool {
        if self.lease_lost(&report.lease) {
            return false;
        }
        if let Some(job) = self.jobs.get_mut(&report.lease.job.0) {
            job.progress = Some(report.progress());
        }
        true
    }

    /// SPEC B8: whether `lease` still holds its job, expired or not.
    pub(crate) fn lease_lost(&self, lease: &Lease) -> bool {
        !self.jobs.get(&lease.job.0).is_some_and(
            |j| matches!(&j.phase, Phase::Running { token, .. } if *token == lease.token),
        )
    }

    pub(crate) fn open_batch(&mut self, batch: &crate::NewBatch, now: DateTime<Utc>) -> BatchId {
        self.next_batch += 1;
        self.batches.insert(
            self.next_batch,
            BatchState {
                name: batch.name.clone(),
                created_at: now,
                on_failure: batch.on_failure,
                after_failure: batch.after_failure,
                sealed: false,
                failed: false,
                released: None,
            },
        );
        BatchId(self.next_batch)
    }

    pub(crate) fn seal(&mut self, id: BatchId, queue: &str) -> Result<()> {
        self.batch(id, queue)?;
        self.batches.get_mut(&id.0).expect("checked").sealed = true;
        Ok(())
    }

    pub(crate) fn batch_progress(
        &self,
        batch: &crate::Batch,
        now: DateTime<Utc>,
    ) -> Result<BatchProgress> {
        let b = self.batch(batch.id, &batch.queue)?;
        let view = View::new(self, now);
        let rows = self
            .jobs
            .values()
            .filter(|j| j.batch == Some(batch.id.0))
            .map(|job| (job.stage.unwrap_or(0), view.state(job), 1));
        let stages = StageProgress::tally(rows);
        let last_finished_at = self
            .jobs
            .values()
            .filter(|j| j.batch == Some(batch.id.0))
            .filter_map(|j| j.finished_at)
            .max();
        Ok(BatchProgress {
            batch: batch.clone(),
            on_failure: b.on_failure,
            after_failure: b.after_failure,
            sealed: b.sealed,
            failed: b.failed,
            released_stage: b.released,
            stages,
            name: b.name.clone(),
            created_at: Some(b.created_at),
            last_finished_at,
        })
    }

    /// The newest `limit` batches' progress.
    pub(crate) fn batches(
        &self,
        queue: &str,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<BatchProgress>> {
        self.batches
            .keys()
            .rev()
            .take(limit)
            .map(|id| {
                let batch = crate::Batch {
                    queue: queue.to_owned(),
                    id: BatchId(*id),
                };
                self.batch_progress(&batch, now)
            })
            .collect()
    }

    /// SPEC M5: the batch's job ids above `after`, in order.
    pub(crate) fn batch_jobs(
        &self,
        batch: &crate::Batch,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<JobId>> {
        self.batch(batch.id, &batch.queue)?;
        let from = after.map_or(i64::MIN, |a| a.0.saturating_add(1));
        Ok(self
            .jobs
            .range(from..)
            .filter(|(_, j)| j.batch == Some(batch.id.0))
            .take(limit)
            .map(|(id, _)| JobId(*id))
            .collect())
    }

    /// SPEC B7: cancels one unfinished job; false when already finished. `why` goes to
    /// the log of an attempt it cuts short (a [`cancelled_by`](crate::cancelled_by)).
    pub(crate) fn cancel_job(
        &mut self,
        id: JobId,
        queue: &str,
        now: DateTime<Utc>,
        why: &str,
    ) -> Result<bool> {
        let job = self
            .jobs
            .get_mut(&id.0)
            .ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        if matches!(job.phase, Phase::Finished(_)) {
            return Ok(false);
        }
        job.close_attempt(now, AttemptOutcome::Cancelled, Some(why), None);
        self.finish(id.0, JobState::Cancelled, now);
        Ok(true)
    }

    /// SPEC B9: cancels every unfinished job, each batch's highest stage first, then
    /// the jobs of no batch, each group's last first; how many.
    pub(crate) fn purge(&mut self, queue: &str, now: DateTime<Utc>) -> Result<u64> {
        let batches: BTreeSet<i64> = self.open_jobs().filter_map(|j| j.batch).collect();
        let mut n = 0;
        for id in batches {
            let batch = crate::Batch {
                queue: queue.to_owned(),
                id: BatchId(id),
            };
            n += self.cancel_batch(&batch, now, crate::cancelled_by::PURGE)?;
        }
        let mut rest: Vec<OrderKey> = self.open_jobs().map(Job::order_key).collect();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        for (_, _, id) in rest {
            n += u64::from(self.cancel_job(JobId(id), queue, now, crate::cancelled_by::PURGE)?);
        }
        Ok(n)
    }

    pub(crate) fn cancel_batch(
        &mut self,
        batch: &crate::Batch,
        now: DateTime<Utc>,
        why: &str,
    ) -> Result<u64> {
        self.seal(batch.id, &batch.queue)?;
        // Highest stage first, so cancelling a stage never releases the next one.
        let mut ids: Vec<(Option<i32>, i64)> = self
            .open_jobs()
            .filter(|j| j.batch == Some(batch.id.0))
            .map(|j| (j.stage, j.id))
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let ids: Vec<i64> = ids.into_iter().map(|(_, id)| id).collect();
        for id in &ids {
            self.cancel_job(JobId(*id), &batch.queue, now, why)?;
        }
        Ok(ids.len() as u64)
    }

    /// SPEC M2. Jobs of a batch are left dead: reviving one would run it after later
    /// stages already started, breaking the order barrier. A job whose dedupe key is
    /// now held by another unfinished job stays dead too.
    pub(crate) fn retry_dead(&mut self, ids: Option<&[JobId]>, now: DateTime<Utc>) -> u64 {
        let wanted: Vec<i64> = match ids {
            Some(ids) => ids.iter().map(|id| id.0).collect(),
            None => self.jobs.keys().copied().collect(),
        };
        let mut n = 0;
        for id in wanted {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            // A job at the attempt counter's cap could get no attempt more.
            if job.phase != Phase::Finished(JobState::Dead)
                || job.batch.is_some()
                || job.attempts >= u32::from(i16::MAX.unsigned_abs())
            {
                continue;
            }
            if let Some(key) = &job.dedupe_key {
                if self.dedupe.contains_key(key) {
                    continue;
                }
                self.dedupe.insert(key.clone(), id);
            }
            // Attempts go on counting, so the log never numbers two attempts alike;
            // the job gets its enqueued budget again on top of what it spent.
            let budget = *job.budget.get_or_insert(job.max_attempts);
            job.max_attempts = grown_budget(job.attempts, budget);
            job.phase = Phase::Waiting;
            job.finished_at = None;
            job.run_at = now;
            self.open.insert(id);
            n += 1;
        }
        n
    }

    /// SPEC M9: `beat` replaces its worker's last one; beats older than
    /// [`BEAT_KEPT`](crate::workers::BEAT_KEPT) go.
    pub(crate) fn worker_beat(&mut self, beat: &crate::WorkerBeat, now: DateTime<Utc>) {
        let kept = now - TimeDelta::from_std(crate::workers::BEAT_KEPT).unwrap_or(TimeDelta::MAX);
        self.workers.retain(|_, (_, at)| *at > kept);
        self.workers
            .insert(beat.worker.clone(), (beat.clone(), now));
    }

    /// SPEC M9: the workers seen within [`BEAT_KEPT`](crate::workers::BEAT_KEPT), the
    /// most recent first.
    pub(crate) fn workers(&self, now: DateTime<Utc>) -> Vec<crate::WorkerSeen> {
        let kept = now - TimeDelta::from_std(crate::workers::BEAT_KEPT).unwrap_or(TimeDelta::MAX);
        let mut seen: Vec<crate::WorkerSeen> = self
            .workers
            .values()
            .filter(|(_, at)| *at > kept)
            .map(|(beat, at)| crate::WorkerSeen {
                beat: beat.clone(),
                last_seen: *at,
            })
            .collect();
        seen.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then(a.beat.worker.cmp(&b.beat.worker))
        });
        seen
    }

    /// SPEC M10: the jobs among `ids` that wait only for their time, due now.
    pub(crate) fn run_now(&mut self, ids: &[JobId], now: DateTime<Utc>) -> u64 {
        let view = View::new(self, now);
        let due: Vec<i64> = ids
            .iter()
            .filter_map(|id| self.jobs.get(&id.0))
            .filter(|j| {
                j.run_at > now && matches!(view.state(j), JobState::Scheduled | JobState::Retrying)
            })
            .map(|j| j.id)
            .collect();
        for id in &due {
            if let Some(job) = self.jobs.get_mut(id) {
                job.run_at = now;
            }
        }
        due.len() as u64
    }

    /// SPEC M8: the finished jobs among `ids`, gone as if pruned.
    pub(crate) fn delete_jobs(&mut self, ids: &[JobId]) -> u64 {
        let mut deleted = 0;
        for id in ids {
            if self
                .jobs
                .get(&id.0)
                .is_some_and(|j| matches!(j.phase, Phase::Finished(_)))
            {
                self.jobs.remove(&id.0);
                deleted += 1;
            }
        }
        deleted
    }

    /// SPEC M3: deletes finished jobs older than `cutoff`, and sealed batches left
    /// with no job.
    pub(crate) fn prune(&mut self, cutoff: DateTime<Utc>) -> u64 {
        let before = self.jobs.len();
        self.jobs
            .retain(|_, j| j.finished_at.is_none_or(|t| t > cutoff));
        let pruned = (before - self.jobs.len()) as u64;
        let live: BTreeSet<i64> = self.jobs.values().filter_map(|j| j.batch).collect();
        self.batches.retain(|id, b| !b.sealed || live.contains(id));
        pruned
    }

    pub(crate) fn stats(&self, queue: &str, now: DateTime<Utc>) -> QueueStats {
        let view = View::new(self, now);
        let mut stats = QueueStats {
            queue: queue.to_owned(),
            paused: self.paused,
            max_running: self.max_running,
            rate: self.rate,
            rate_next: self.rate.and_then(|r| {
                crate::kit::rate::next_start(&r, self.rate_tat, now.timestamp_micros())
                    .and_then(DateTime::from_timestamp_micros)
            }),
            ..QueueStats::default()
        };
        for job in self.jobs.values() {
            *stats.counts.entry(view.state(job)).or_default() += 1;
        }
        stats.oldest_ready = self
            .jobs
            .values()
            .filter(|j| view.claimable(j))
            .map(|j| j.run_at)
            .min();
        stats
    }

    pub(crate) fn job_info(&self, id: JobId, queue: &str, now: DateTime<Utc>) -> Result<JobInfo> {
        let job = self
            .jobs
            .get(&id.0)
            .ok_or_else(|| Error::not_found(format!("job {id} in queue {queue:?}")))?;
        Ok(self.info(job, queue, &View::new(self, now)))
    }

    fn info(&self, job: &Job, queue: &str, view: &View<'_>) -> JobInfo {
        JobInfo {
            id: JobId(job.id),
            queue: queue.to_owned(),
            state: view.state(job),
            payload: job.payload.clone(),
            priority: job.priority,
            run_at: job.run_at,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            group: job.group.clone(),
            batch: job.batch.map(BatchId),
            stage: job.stage,
            dedupe_key: job.dedupe_key.clone(),
            enqueued_by: job.enqueued_by.clone(),
            created_at: job.created_at,
            finished_at: job.finished_at,
            last_error: job.last_error.clone(),
            attempt_log: job.log.clone(),
            progress: job.progress.clone(),
            limit_key: job.limit_key.clone(),
            after: {
                let mut after: Vec<JobId> = job.after.iter().copied().map(JobId).collect();
                after.sort_unstable();
                after
            },
        }
    }

    /// SPEC M7: matching ids below `before`, newest first, within the scan bound.
    pub(crate) fn list_jobs(
        &self,
        filter: &crate::JobFilter,
        before: Option<JobId>,
        limit: u32,
        now: DateTime<Utc>,
    ) -> crate::JobPage {
        let view = View::new(self, now);
        let below = before.map_or(i64::MAX, |b| b.0);
        let scan = self
            .jobs
            .range(..below)
            .rev()
            .zip(1_i64..)
            .map(|((id, j), place)| {
                let fields = crate::JobFields {
                    state: view.state(j),
                    batch: j.batch.map(BatchId),
                    stage: j.stage,
                    group: j.group.as_deref(),
                    payload: &j.payload,
                    last_error: j.last_error.as_deref(),
                };
                (*id, filter.matches(&fields), place)
            });
        crate::JobPage::from_scan(scan, limit)
    }

    pub(crate) fn dead_jobs(&self, queue: &str, limit: usize, now: DateTime<Utc>) -> Vec<JobInfo> {
        let view = View::new(self, now);
        self.jobs
            .values()
            .filter(|j| j.phase == Phase::Finished(JobState::Dead))
            .take(limit)
            .map(|j| self.info(j, queue, &view))
            .collect()
    }

    pub(crate) fn running(&self) -> Vec<RunningJob> {
        self.open_jobs()
            .filter_map(|j| match &j.phase {
                Phase::Running {
                    expires_at, worker, ..
                } => Some(RunningJob {
                    id: JobId(j.id),
                    worker: worker.clone(),
                    attempt: j.attempts,
                    started_at: j.log.last().map_or(j.created_at, |r| r.started_at),
                    lease_expires_at: *expires_at,
                    progress: j.progress.clone(),
                }),
                _ => None,
            })
            .collect()
    }
}
