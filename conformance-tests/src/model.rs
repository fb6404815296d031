//! Model-based checking: one random sequence of operations runs on a subject backend
//! and on the in-memory reference model, and every answer must agree: which jobs a
//! claim returns and in what order, how each settle is judged, every job's state and
//! every batch's progress after each step.
//!
//! Use it from a backend's tests with proptest (see `relayq-sqlite/tests/model.rs`):
//! shrinking then hands back the shortest sequence on which the backend and the model
//! disagree.

use std::{fmt::Debug, sync::Arc, time::Duration};

use anyhow::{bail, ensure};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use proptest::{collection::vec, prelude::*};
use relayq_core::{
    Backend, Batch, ClaimRequest, CompleteExt, Error, Hold, InspectExt, JobId, JobState, Lease,
    NewJob, OnFailure, ProgressReport, Retry, Settle, Why,
    memory::{Clock, MemoryBackend},
    schedule::{Fired, Schedule},
};

/// One job to enqueue.
#[derive(Debug, Clone)]
pub struct Spec {
    priority: i16,
    group: Option<u8>,
    /// Batch index (0: `Continue`, 1: `Halt`) and stage.
    batch: Option<(usize, i32)>,
    /// A dedupe key from a small set, so keys collide.
    dedupe: Option<u8>,
    /// A limit key from a small set (SPEC K), for subjects that keep them.
    key: Option<u8>,
    /// A job of its batch it runs after (SPEC D), for subjects that keep dependencies:
    /// `(true, n)` the n-th of the same call, `(false, n)` the n-th job stored; and
    /// whether it runs anyway when that one fails (SPEC D4).
    after: Option<(bool, u8, bool)>,
}

/// One step of a run. Indices wrap around what exists, so every sequence is valid.
#[derive(Debug, Clone)]
pub enum Op {
    /// Enqueue these jobs in one call.
    Enqueue(Vec<Spec>),
    /// Claim up to this many.
    Claim(u32),
    /// Complete the n-th held lease.
    Complete(usize),
    /// Fail the n-th held lease; permanently when true.
    Fail(usize, bool),
    /// Release the n-th held lease.
    Release(usize),
    /// Cancel the n-th job.
    Cancel(usize),
    /// Seal the n-th batch.
    Seal(usize),
    /// Cancel the n-th batch.
    CancelBatch(usize),
    /// Retry the n-th job if dead, or with `None` every dead job.
    RetryDead(Option<usize>),
    /// Store (or replace) schedule n of three, firing once a year: its slot makes a
    /// staged batch when true, else one job holding a dedupe key.
    Schedule(u8, bool),
    /// Pause (true) or resume schedule n.
    PauseSchedule(u8, bool),
    /// Delete schedule n.
    DeleteSchedule(u8),
    /// Run schedule n now.
    RunNow(u8),
    /// Ask why the n-th job is not running (SPEC M6).
    Why(usize),
    /// Ask which held leases are lost (SPEC B8).
    Lost,
    /// Report progress (percent) under the n-th held lease (SPEC L7).
    Progress(usize, u8),
    /// Purge the queue (SPEC B9).
    Purge,
    /// List the jobs in a state (an index into `JobState::ALL`), of a group, or of a
    /// batch, following every page of this size (SPEC M7).
    List(Option<u8>, Option<u8>, Option<usize>, u32),
    /// Delete the n-th job, if finished (SPEC M8).
    Delete(usize),
    /// Fail the n-th held lease with a retry an hour away.
    FailLater(usize),
    /// Make the n-th job due now, if it waits only for its time (SPEC M10).
    RunJobNow(usize),
    /// Set the limit of key n, or with `None` the default of every key; `None` lifts
    /// it (SPEC K1, K3).
    SetKeyLimit(Option<u8>, Option<u32>),
    /// Claim up to this many, the first this many of which start at once (SPEC K6).
    ClaimAhead(u32, u32),
    /// Set the queue's rate to n per hour with a burst of n, or with `None` lift it
    /// (SPEC K8): an hour is longer than any run, so the queue starts exactly n jobs
    /// after each set, on either side.
    SetRate(Option<u8>),
    /// Set the rate of key n, or with `None` the default of every key, to m per hour
    /// with a burst of m; `None` lifts it (SPEC K12).
    SetKeyRate(Option<u8>, Option<u8>),
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        -1i16..=1,
        prop::option::weighted(0.6, 0u8..3),
        prop::option::weighted(0.5, (0usize..2, prop::sample::select(vec![100, 200, 300]))),
        prop::option::weighted(0.25, 0u8..2),
        prop::option::weighted(0.5, 0u8..3),
        prop::option::weighted(0.4, (any::<bool>(), any::<u8>(), prop::bool::weighted(0.3))),
    )
        .prop_map(|(priority, group, batch, dedupe, key, after)| Spec {
            priority,
            group,
            batch,
            dedupe,
            key,
            after,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => vec(spec(), 1..4).prop_map(Op::Enqueue),
        4 => (1u32..4).prop_map(Op::Claim),
        3 => any::<usize>().prop_map(Op::Complete),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, p)| Op::Fail(i, p)),
        1 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::Seal),
        1 => any::<usize>().prop_map(Op::CancelBatch),
        1 => any::<Option<usize>>().prop_map(Op::RetryDead),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, b)| Op::Schedule(n, b)),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, p)| Op::PauseSchedule(n, p)),
        1 => (0u8..3).prop_map(Op::DeleteSchedule),
        2 => (0u8..3).prop_map(Op::RunNow),
        2 => any::<usize>().prop_map(Op::Why),
        1 => Just(Op::Lost),
        2 => (any::<usize>(), 0u8..=100).prop_map(|(i, p)| Op::Progress(i, p)),
        1 => Just(Op::Purge),
        2 => (
            prop::option::of(0u8..8),
            prop::option::weighted(0.3, 0u8..3),
            prop::option::weighted(0.3, 0usize..2),
            1u32..4,
        )
            .prop_map(|(s, g, b, limit)| Op::List(s, g, b, limit)),
        1 => any::<usize>().prop_map(Op::Delete),
        1 => any::<usize>().prop_map(Op::FailLater),
        2 => any::<usize>().prop_map(Op::RunJobNow),
        2 => (prop::option::weighted(0.7, 0u8..3), prop::option::weighted(0.8, 1u32..3))
            .prop_map(|(k, n)| Op::SetKeyLimit(k, n)),
        2 => (1u32..5, 0u32..3).prop_map(|(limit, slots)| Op::ClaimAhead(limit, slots)),
        1 => prop::option::weighted(0.7, 1u8..4).prop_map(Op::SetRate),
        2 => (prop::option::weighted(0.6, 0u8..3), prop::option::weighted(0.8, 1u8..3))
            .prop_map(|(k, n)| Op::SetKeyRate(k, n)),
    ]
}

/// Random operation sequences of up to `max_len` steps.
pub fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    vec(op(), 1..max_len)
}

/// The system clock cut to whole microseconds, the precision SQL backends store, so
/// that the model orders equal-looking times the way they do.
#[derive(Debug)]
struct MicrosClock;

impl Clock for MicrosClock {
    fn now(&self) -> DateTime<Utc> {
        let now = Utc::now();
        now.duration_trunc(TimeDelta::microseconds(1))
            .unwrap_or(now)
    }
}

/// A fresh reference model for [`check`].
#[must_use]
pub fn reference() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::with(
        Arc::new(MicrosClock),
        relayq_core::Limits::default(),
    ))
}

/// One backend's view of the run: its queue, batches, job ids and held leases.
struct Side {
    b: Arc<dyn Backend>,
    queue: String,
    batches: Vec<Batch>,
    ids: Vec<JobId>,
    held: Vec<Lease>,
    /// Whether the run uses limit keys: only when the subject keeps them.
    keys: bool,
    /// Whether the run sets rates: only when the subject keeps them.
    rates: bool,
    /// Whether jobs run after others: only when the subject keeps dependencies.
    deps: bool,
}

/// An answer reduced to what both backends must agree on.
fn verdict<T: Debug>(r: &Result<T, Error>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(Error::InvalidInput { field, .. }) => format!("invalid {field}"),
        Err(e @ (Error::StaleLease | Error::StageClosed { .. })) => e.to_string(),
        // Its text names the queue, which differs between the two sides.
        Err(Error::NotFound { .. }) => "not found".to_owned(),
        Err(e) => format!("error {e}"),
    }
}

impl Side {
    async fn new(b: Arc<dyn Backend>, keys: bool, rates: bool, deps: bool) -> anyhow::Result<Self> {
        let queue = crate::queue_name("model");
        let batches = vec![
            b.open_batch(&queue, OnFailure::Continue).await?,
            b.open_batch(&queue, OnFailure::Halt).await?,
        ];
        Ok(Self {
            b,
            queue,
            batches,
            ids: Vec::new(),
            held: Vec::new(),
            keys,
            rates,
            deps,
        })
    }

    fn index(&self, id: JobId) -> usize {
        self.ids.iter().position(|i| *i == id).unwrap_or(usize::MAX)
    }

    /// Applies `op`; returns the answer in backend-neutral terms (job indices, not ids).
    async fn apply(&mut self, op: &Op) -> anyhow::Result<String> {
        let b = &*self.b;
        Ok(match op {
            Op::Enqueue(specs) => {
                let jobs = specs
                    .iter()
                    .map(|s| {
                        let mut job = NewJob::new(&self.queue, vec![]).priority(s.priority);
                        if let Some(g) = s.group {
                            job = job.group(format!("g{g}"));
                        }
                        if let Some((i, stage)) = s.batch {
                            job = job.in_batch(self.batches[i].id, stage);
                        }
                        if let Some(k) = s.dedupe {
                            job = job.dedupe_key(format!("k{k}"));
                        }
                        if let (Some(k), true) = (s.key, self.keys) {
                            job = job.limit_key(format!("lk{k}"));
                        }
                        if let (Some((call, n, run)), true) = (s.after, self.deps) {
                            let n = usize::from(n);
                            if call {
                                job = job.after_call(n % specs.len());
                            } else if !self.ids.is_empty() {
                                job = job.after(self.ids[n % self.ids.len()]);
                            }
                            if run {
                                job = job.after_failure(relayq_core::AfterFailure::Run);
                            }
                        }
                        job
                    })
                    .collect();
                let r = b.enqueue(jobs).await;
                let mut answer = Vec::new();
                if let Ok(out) = &r {
                    for e in out {
                        // A deduplicated job answers with an existing job's index.
                        if !e.deduplicated {
                            self.ids.push(e.id);
                        }
                        answer.push((self.index(e.id), e.deduplicated));
                    }
                }
                verdict(&r.map(|_| answer))
            }
            Op::Claim(_) | Op::ClaimAhead(..) => {
                let req = match op {
                    Op::ClaimAhead(limit, slots) => {
                        ClaimRequest::new(&self.queue, "model", *limit, Duration::from_secs(60))
                            .with_slots(*slots)
                    }
                    Op::Claim(limit) => {
                        ClaimRequest::new(&self.queue, "model", *limit, Duration::from_secs(60))
                    }
                    _ => unreachable!("matched above"),
                };
                let r = b.claim_paced(req).await;
                let got: Vec<usize> = match &r {
                    Ok(c) => c.jobs.iter().map(|j| self.index(j.id())).collect(),
                    Err(_) => Vec::new(),
                };
                // Whether the rate cut the claim, not how long it says to wait.
                let paced = r.as_ref().is_ok_and(|c| c.next_in.is_some());
                if let Ok(c) = r {
                    self.held.extend(c.jobs.into_iter().map(|j| j.lease));
                }
                format!("claimed {got:?} paced {paced}")
            }
            Op::Complete(i) | Op::Fail(i, _) | Op::FailLater(i) | Op::Release(i) => {
                if self.held.is_empty() {
                    return Ok("no lease".into());
                }
                let lease = self.held.remove(i % self.held.len());
                let settle = match op {
                    Op::Complete(_) => Settle::complete(lease),
                    Op::Fail(_, true) => Settle::fail(lease, "boom", Retry::Never),
                    Op::Fail(_, false) => Settle::fail(lease, "boom", Retry::After(Duration::ZERO)),
                    Op::FailLater(_) => {
                        Settle::fail(lease, "later", Retry::After(Duration::from_secs(3600)))
                    }
                    _ => Settle::release(lease),
                };
                // Retry times differ between backends; the kind of outcome must not.
                let r = b.settle_one(settle).await;
                verdict(&r.map(|s| std::mem::discriminant(&s)))
            }
            Op::Cancel(i) => {
                if self.ids.is_empty() {
                    return Ok("no job".into());
                }
                verdict(
                    &b.cancel_job(&self.queue, self.ids[i % self.ids.len()])
                        .await,
                )
            }
            Op::Seal(i) => verdict(&b.seal(&self.batches[i % 2]).await),
            Op::CancelBatch(i) => verdict(&b.cancel_batch(&self.batches[i % 2]).await),
            Op::RetryDead(pick) => {
                let ids = pick
                    .filter(|_| !self.ids.is_empty())
                    .map(|i| vec![self.ids[i % self.ids.len()]]);
                verdict(&b.retry_dead(&self.queue, ids.as_deref()).await)
            }
            Op::Schedule(n, batch) => {
                let q = &self.queue;
                let mut s = Schedule::new(q, format!("s{n}"), "0 0 1 1 *");
                s = if *batch {
                    s.batch(OnFailure::Halt)
                        .job(NewJob::new(q, vec![]).stage(1))
                        .job(NewJob::new(q, vec![]).stage(2))
                } else {
                    s.job(NewJob::new(q, vec![]).dedupe_key(format!("k{n}")))
                };
                verdict(&b.put_schedule(&s).await)
            }
            Op::PauseSchedule(n, paused) => verdict(
                &b.pause_schedule(&self.queue, &format!("s{n}"), *paused)
                    .await,
            ),
            Op::DeleteSchedule(n) => {
                verdict(&b.delete_schedule(&self.queue, &format!("s{n}")).await)
            }
            Op::Why(i) => {
                if self.ids.is_empty() {
                    return Ok("no job".into());
                }
                let r = b.why(&self.queue, self.ids[i % self.ids.len()]).await;
                let answer = r.as_ref().map(|w| self.neutral(w)).unwrap_or_default();
                verdict(&r.map(|_| answer))
            }
            Op::Lost => {
                let r = b.lost_leases(&self.held).await;
                let mut lost: Vec<usize> = match &r {
                    Ok(ids) => ids.iter().map(|id| self.index(*id)).collect(),
                    Err(_) => Vec::new(),
                };
                lost.sort_unstable();
                verdict(&r.map(|_| lost))
            }
            Op::Progress(i, percent) => {
                if self.held.is_empty() {
                    return Ok("no lease".into());
                }
                let report = ProgressReport {
                    lease: self.held[i % self.held.len()].clone(),
                    percent: *percent,
                    message: format!("at {percent}"),
                };
                let r = b.report_progress(&[report]).await;
                let lost: Vec<usize> = match &r {
                    Ok(ids) => ids.iter().map(|id| self.index(*id)).collect(),
                    Err(_) => Vec::new(),
                };
                verdict(&r.map(|_| lost))
            }
            Op::Purge => verdict(&b.purge(&self.queue).await),
            Op::SetKeyLimit(key, limit) => {
                if !self.keys {
                    return Ok("no keys".into());
                }
                let key = key.map(|k| format!("lk{k}"));
                verdict(&b.set_key_limit(&self.queue, key.as_deref(), *limit).await)
            }
            Op::SetRate(n) => {
                if !self.rates {
                    return Ok("no rates".into());
                }
                let rate = n.map(|n| {
                    relayq_core::Rate::new(u32::from(n), Duration::from_secs(3600))
                        .with_burst(u32::from(n))
                });
                let update = relayq_core::QueueUpdate::default().rate(rate);
                verdict(&b.update_queue(&self.queue, update).await)
            }
            Op::SetKeyRate(key, n) => {
                if !(self.rates && self.keys) {
                    return Ok("no key rates".into());
                }
                let key = key.map(|k| format!("lk{k}"));
                let rate = n.map(|n| {
                    relayq_core::Rate::new(u32::from(n), Duration::from_secs(3600))
                        .with_burst(u32::from(n))
                });
                verdict(&b.set_key_rate(&self.queue, key.as_deref(), rate).await)
            }
            Op::RunJobNow(i) => {
                if self.ids.is_empty() {
                    return Ok("no job".into());
                }
                let id = self.ids[i % self.ids.len()];
                verdict(&b.run_now(&self.queue, &[id]).await)
            }
            Op::Delete(i) => {
                if self.ids.is_empty() {
                    return Ok("no job".into());
                }
                let id = self.ids[i % self.ids.len()];
                verdict(&b.delete_jobs(&self.queue, &[id]).await)
            }
            Op::List(state, group, batch, limit) => {
                let filter = relayq_core::JobFilter {
                    state: state.map(|s| JobState::ALL[usize::from(s) % JobState::ALL.len()]),
                    group: group.map(|g| format!("g{g}")),
                    batch: batch.map(|i| self.batches[i % self.batches.len()].id),
                    ..relayq_core::JobFilter::default()
                };
                let mut listed = Vec::new();
                let mut before = None;
                loop {
                    match b.list_jobs(&self.queue, &filter, before, *limit).await {
                        Ok(page) => {
                            listed.extend(page.jobs.iter().map(|id| self.index(*id)));
                            match page.next {
                                Some(next) => before = Some(next),
                                None => break,
                            }
                        }
                        Err(e) => return Ok(format!("list: {:?}", e.kind())),
                    }
                }
                format!("listed {listed:?}")
            }
            Op::RunNow(n) => {
                let r = b.run_schedule_now(&self.queue, &format!("s{n}")).await;
                let answer = match &r {
                    Ok(Fired::Made { batch, jobs }) => {
                        let mut made = Vec::new();
                        for e in jobs {
                            if !e.deduplicated {
                                self.ids.push(e.id);
                            }
                            made.push((self.index(e.id), e.deduplicated));
                        }
                        format!("made batch {} jobs {made:?}", batch.is_some())
                    }
                    Ok(other) => format!("{other:?}"),
                    Err(_) => String::new(),
                };
                verdict(&r.map(|_| answer))
            }
        })
    }

    /// A `why` answer with job and batch indices for ids, and no times (each side's
    /// clock reads its own).
    fn neutral(&self, why: &Why) -> String {
        let batch = |id| self.batches.iter().position(|b| b.id == id);
        match why {
            Why::Running { worker, .. } => format!("running on {worker}"),
            Why::Held(holds) => {
                let holds: Vec<String> = holds
                    .iter()
                    .map(|h| match h {
                        Hold::NotBefore(_) => "not before".to_owned(),
                        Hold::Backoff {
                            attempts,
                            max_attempts,
                            ..
                        } => format!("backoff {attempts}/{max_attempts}"),
                        Hold::Stage {
                            batch: id,
                            stage,
                            waiting_for,
                            unfinished,
                        } => format!(
                            "batch {:?} stage {stage} waits for {waiting_for} ({unfinished})",
                            batch(*id)
                        ),
                        Hold::After { jobs, more } => {
                            let idx: Vec<usize> = jobs.iter().map(|j| self.index(*j)).collect();
                            format!("after {idx:?} more {more}")
                        }
                        Hold::Group { group, holder } => {
                            format!("group {group} held by {:?}", holder.map(|h| self.index(h)))
                        }
                        Hold::Rate { rate, .. } => format!("rate {rate}"),
                        Hold::KeyRate { key, rate, .. } => format!("key {key} rate {rate}"),
                        other => format!("{other:?}"),
                    })
                    .collect();
                format!("held {holds:?}")
            }
            other => format!("{other:?}"),
        }
    }

    /// Every job's state and every batch's progress, in backend-neutral terms.
    async fn snapshot(&self) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        for (i, id) in self.ids.iter().enumerate() {
            // A job deleted (SPEC M8) is gone alike everywhere.
            let info = match self.b.job(&self.queue, *id).await {
                Err(e) if e.kind() == relayq_core::ErrorKind::NotFound => {
                    out.push(format!("job {i}: gone"));
                    continue;
                }
                read => read?,
            };
            let progress = info.progress.map(|p| (p.attempt, p.percent, p.message));
            let after: Vec<usize> = info.after.iter().map(|a| self.index(*a)).collect();
            out.push(format!(
                "job {i}: {} attempts {} progress {progress:?} after {after:?}",
                info.state, info.attempts
            ));
        }
        for (i, batch) in self.batches.iter().enumerate() {
            let p = self.b.batch_progress(batch).await?;
            out.push(format!(
                "batch {i}: sealed {} failed {} released {:?} stages {:?}",
                p.sealed, p.failed, p.released_stage, p.stages
            ));
        }
        if self.keys {
            // A key's next start is a time on each side's clock: whether it has one.
            let keys = self.b.key_limits(&self.queue).await?;
            let each: Vec<String> = keys
                .keys
                .iter()
                .map(|k| {
                    format!(
                        "{} running {} own {:?} limit {:?} own rate {:?} rate {:?} waits {}",
                        k.key,
                        k.running,
                        k.own,
                        k.limit,
                        k.own_rate,
                        k.rate,
                        k.rate_next.is_some()
                    )
                })
                .collect();
            out.push(format!(
                "keys default {:?} rate {:?}: {each:?}",
                keys.default, keys.default_rate
            ));
        }
        if self.rates {
            let stats = self.b.queue_stats(&self.queue).await?;
            out.push(format!(
                "rate {:?} waits {}",
                stats.rate,
                stats.rate_next.is_some()
            ));
        }
        for s in self.b.schedules(&self.queue).await? {
            out.push(format!(
                "schedule {}: version {} paused {} fired {}",
                s.name,
                s.version,
                s.paused,
                s.last_slot.is_some()
            ));
        }
        Ok(out)
    }
}

/// Runs `ops` on `subject` and on `reference`, failing at the first step where an
/// answer or the resulting state differs.
///
/// # Errors
/// A description of the first disagreement, with the steps that led to it.
pub async fn check(
    reference: Arc<dyn Backend>,
    subject: Arc<dyn Backend>,
    ops: &[Op],
) -> anyhow::Result<()> {
    let limits = subject.limits();
    let (keys, rates, deps) = (limits.limit_keys, limits.rates, limits.dependencies);
    let mut model = Side::new(reference, keys, rates, deps).await?;
    let mut real = Side::new(subject, keys, rates, deps).await?;
    for (step, op) in ops.iter().enumerate() {
        let (want, got) = (model.apply(op).await?, real.apply(op).await?);
        ensure!(
            want == got,
            "step {step} {op:?}: model answered {want}, backend {got}"
        );
        let (want, got) = (model.snapshot().await?, real.snapshot().await?);
        if let Some((w, g)) = want.iter().zip(&got).find(|(w, g)| w != g) {
            bail!("after step {step} {op:?}: model has {w}, backend has {g}");
        }
    }
    Ok(())
}
