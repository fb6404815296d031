//! Heartbeats for every started job of a worker, from one task (SPEC W1).
//!
//! A job is kept from the moment it starts until it ends: until the settler has stored
//! its outcome or given up on it (a slow settle must not let a finished job's lease
//! expire and the job run again), or until its run ended without handing one over.
//! Each lease is extended on a fixed schedule, every `every` from its claim. When a beat
//! finds the lease lost (cancelled, or expired and taken over), the job is stopped,
//! which stops its handler: someone else owns the job now.
//!
//! So is a job whose lease runs out while no beat gets through (the server unreachable,
//! a beat that hangs): past that point another worker may hold the job, and the
//! handler must not run on beside it. The keeper reckons the lease on its own clock,
//! from when the claim or the last beat that renewed it was sent, and stops the
//! handler a margin before that end (see [`Keeper::margin_less`]). Each beat is given
//! one interval to answer. A job whose outcome is already with the settler is not
//! stopped (there is nothing left to stop, and the outcome may still be stored) and
//! its lease is beaten on.
//!
//! A cancel reaches the handler sooner than the next beat: see [`revoke`](super::revoke).
//!
//! One task with one timer queue, rather than a timer task per job: short jobs end long
//! before their first beat, and then all a job costs here is two messages. Heartbeats
//! stay off the jobs' tasks, so a handler that blocks its thread does not stop them
//! while the runtime has another.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::time::{DelayQueue, delay_queue};

use super::{
    context::LeaseDeadline,
    control::{Control, Msg},
    progress,
    revoke::{self, Due, Watch},
    stats::Stats,
};
use crate::{Backend, Error, JobId, Lease, LeaseToken, ProgressReport};

type Key = (JobId, LeaseToken);

struct Held {
    lease: Lease,
    /// When its next beat is due, and its entry in the timer queue; no entry while a
    /// beat is in flight or once the lease is lost.
    next: Instant,
    timer: Option<delay_queue::Key>,
    /// The lease's end by the last claim or beat that set it, in the lease queue; none
    /// once it ran out.
    until: Option<delay_queue::Key>,
    control: Arc<Control>,
}

pub(super) struct Keeper {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) length: Duration,
    pub(super) every: Duration,
    /// Counts the jobs that ended with no outcome (lease lost, or run dropped), and
    /// tracks outages: one warning per outage, not per failed beat.
    pub(super) stats: Arc<Stats>,
    /// Where cancels are heard of: subscribed before the keeper's task starts, so that
    /// no cancel sent meanwhile is missed.
    pub(super) watch: Option<Watch>,
}

impl Keeper {
    /// How long after a claim or a renewing beat is sent the handler may run without
    /// another: the lease, less a margin for the timer's resolution and the handler's
    /// stop. The margin is half of the shorter of the interval and what the lease
    /// leaves after it, so the next beat is always due before the deadline (at the
    /// default interval, lease/3, the margin is lease/6).
    fn margin_less(&self) -> Duration {
        margin_less(self.length, self.every)
    }

    /// The lease's deadline after a claim or renewing beat sent at `sent`.
    fn deadline(&self, sent: Instant) -> LeaseDeadline {
        LeaseDeadline {
            stop_at: sent + self.margin_less(),
            lease_ends: sent + self.length,
        }
    }

    /// Runs until every sender of `rx` is gone.
    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut held: HashMap<Key, Held> = HashMap::new();
        let mut timers: DelayQueue<Key> = DelayQueue::new();
        let mut leases: DelayQueue<Key> = DelayQueue::new();
        // An `Ended` before its `Started`: today `Started` is sent before the job is
        // handed to its slot, so this is a guard, kept in case that order changes.
        let mut ended_early: HashSet<Key> = HashSet::new();
        let mut beating = FuturesUnordered::new();
        let mut watch = self.watch.take().expect("a keeper runs once");
        let mut poll = watch.poll.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut due = Due::default();
        let mut checking = FuturesUnordered::new();
        // When a cancel was last heard of, per queue and for all (a resync, a lag): a job
        // claimed before it and started after it (its claim's answer on the way, or held
        // in the buffer) is checked as it starts, or that cancel would be missed.
        let mut heard: HashMap<Arc<str>, Instant> = HashMap::new();
        let mut heard_all: Option<Instant> = None;
        // A check that failed is tried again after a pause, not at the next cancel.
        let retry = tokio::time::sleep(revoke::RETRY);
        tokio::pin!(retry);
        let mut retry_armed = false;
        let mut progress_tick = tokio::time::interval(progress::EVERY);
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reporting = FuturesUnordered::new();
        loop {
            if checking.is_empty() && !due.is_empty() {
                let wanted = due.take();
                let keys: Vec<Key> = held
                    .iter()
                    .filter(|(_, h)| {
                        h.until.is_some()
                            && !h.control.handed()
                            && !h.control.stopped()
                            && wanted(&h.lease.queue)
                    })
                    .map(|(k, _)| *k)
                    .collect();
                if !keys.is_empty() {
                    let leases = keys.iter().map(|k| held[k].lease.clone()).collect();
                    let check = revoke::check(self.backend.clone(), leases, self.every);
                    checking.push(async move { (keys, check.await) });
                }
            }
            tokio::select! {
                // A beat's answer before a lease's end seen in the same poll: a beat
                // that renewed the lease must not lose to its old deadline.
                biased;
                msg = rx.recv() => match msg {
                    None => break,
                    Some(Msg::Started { lease, claimed_at, control }) => {
                        let key = (lease.job, lease.token);
                        if !ended_early.remove(&key) {
                            let first = claimed_at + self.every;
                            let timer = Some(timers.insert_at(key, first));
                            let until = Some(leases.insert_at(key, claimed_at + self.margin_less()));
                            control.set_deadline(self.deadline(claimed_at));
                            let since = |t: &Instant| *t >= claimed_at;
                            if heard.get(lease.queue.as_str()).is_some_and(since) || heard_all.as_ref().is_some_and(since) {
                                due.add(Some(Arc::from(lease.queue.as_str())));
                            }
                            held.insert(key, Held { lease, next: first, timer, until, control });
                        }
                    }
                    Some(Msg::Ended(job, token)) => {
                        let key = (job, token);
                        match held.remove(&key) {
                            Some(h) => {
                                // An outcome handed over was counted by the settler;
                                // a run that ended without one is counted here, so
                                // every claimed job lands in one counter.
                                if !h.control.handed() {
                                    if h.control.stopped() {
                                        self.stats.add_lease_lost(&h.lease.queue);
                                    } else {
                                        self.stats.add_lost(1, "no_outcome");
                                    }
                                }
                                if let Some(timer) = h.timer {
                                    timers.remove(&timer);
                                }
                                if let Some(until) = h.until {
                                    leases.remove(&until);
                                }
                            }
                            None => {
                                ended_early.insert(key);
                            }
                        }
                    }
                },
                Some(expired) = timers.next(), if !timers.is_empty() => {
                    let key = expired.into_inner();
                    if let Some(h) = held.get_mut(&key) {
                        h.timer = None;
                        let (backend, lease, length, every) = (self.backend.clone(), h.lease.clone(), self.length, self.every);
                        // The beat runs on a task of its own, and a beat that takes too long
                        // is given up on, not cancelled: dropping a backend call midway can
                        // leave its connection inside a transaction (a SQLite write lock
                        // held by an idle pooled connection stalled every worker of a file).
                        // A backend that panics fails this beat, not the keeper.
                        beating.push(async move {
                            let sent = Instant::now();
                            let beat = tokio::spawn(async move { backend.heartbeat(&lease, length).await });
                            let result = match tokio::time::timeout(every, beat).await {
                                Ok(Ok(result)) => result,
                                Ok(Err(_)) => Err(Error::backend("heartbeat panicked")),
                                Err(_) => Err(Error::backend("heartbeat timed out")),
                            };
                            (key, sent, result)
                        });
                    }
                }
                Some((key, sent, result)) = beating.next(), if !beating.is_empty() => {
                    // Ended meanwhile: nothing to beat or stop.
                    let Some(h) = held.get_mut(&key) else { continue };
                    let handed = h.control.handed();
                    // Its lease ran out and its handler was stopped: no more beats.
                    if h.until.is_none() && !handed {
                        continue;
                    }
                    match result {
                        Err(Error::StaleLease) => {
                            // The server answered.
                            self.stats.outage.succeeded();
                            let lease = &h.lease;
                            if handed || h.control.finished() {
                                // Most likely stored just now, before its `Ended` came.
                                tracing::debug!(queue = %lease.queue, id = %lease.job, "lease gone after the job's run ended");
                            } else {
                                h.control.stop();
                                tracing::warn!(queue = %lease.queue, id = %lease.job, attempt = lease.attempt, "lease lost while running; handler stopped");
                            }
                            // Kept, without beats, until its `Ended`.
                        }
                        other => {
                            match other {
                                Ok(_) => {
                                    self.stats.outage.succeeded();
                                    if let Some(until) = &h.until {
                                        leases.reset_at(until, sent + self.margin_less());
                                        h.control.set_deadline(self.deadline(sent));
                                    }
                                }
                                Err(e) => self.stats.outage.failed("heartbeat", "heartbeat", &e),
                            }
                            // On schedule; after a beat that overran it, one interval on.
                            let now = Instant::now();
                            h.next = Some(h.next + self.every).filter(|t| *t > now).unwrap_or(now + self.every);
                            h.timer = Some(timers.insert_at(key, h.next));
                        }
                    }
                }
                queue = watch.next() => {
                    match &queue {
                        Some(q) => {
                            heard.insert(q.clone(), Instant::now());
                        }
                        None => heard_all = Some(Instant::now()),
                    }
                    due.add(queue);
                }
                () = &mut retry, if retry_armed => {
                    retry_armed = false;
                    due.add(None);
                }
                _ = async { poll.as_mut().expect("guarded").tick().await }, if poll.is_some() && !held.is_empty() => {
                    due.add(None);
                }
                Some((keys, result)) = checking.next(), if !checking.is_empty() => match result {
                    Ok(lost) => {
                        self.stats.outage.succeeded();
                        stop_lost(&mut held, &mut timers, &mut leases, keys, &lost);
                    }
                    Err(e) => {
                        self.stats.outage.failed("heartbeat", "lost_leases", &e);
                        retry.as_mut().reset(Instant::now() + revoke::RETRY);
                        retry_armed = true;
                    }
                },
                _ = progress_tick.tick(), if !held.is_empty() && reporting.is_empty() => {
                    let (keys, reports): (Vec<Key>, Vec<ProgressReport>) = held
                        .iter()
                        .filter(|(_, h)| h.until.is_some() && !h.control.handed() && !h.control.stopped())
                        .filter_map(|(k, h)| {
                            let (percent, message) = progress::take(&h.control)?;
                            Some((*k, ProgressReport { lease: h.lease.clone(), percent, message }))
                        })
                        .unzip();
                    if !reports.is_empty() {
                        let write = progress::write(self.backend.clone(), reports, self.every);
                        reporting.push(async move { (keys, write.await) });
                    }
                }
                Some((keys, result)) = reporting.next(), if !reporting.is_empty() => match result {
                    Ok(lost) => {
                        self.stats.outage.succeeded();
                        stop_lost(&mut held, &mut timers, &mut leases, keys, &lost);
                    }
                    // Those reports are gone; the handler's next ones go in a second.
                    Err(e) => self.stats.outage.failed("heartbeat", "report_progress", &e),
                },
                Some(ran_out) = leases.next(), if !leases.is_empty() => {
                    let key = ran_out.into_inner();
                    if let Some(h) = held.get_mut(&key) {
                        h.until = None;
                        let lease = &h.lease;
                        // An outcome with the settler is beaten on: the server judges it.
                        if !h.control.handed() {
                            h.control.stop();
                            tracing::warn!(queue = %lease.queue, id = %lease.job, attempt = lease.attempt, "lease ran out with no heartbeat through; handler stopped");
                            // Kept, without beats, until its `Ended`.
                            if let Some(timer) = h.timer.take() {
                                timers.remove(&timer);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Stops the jobs of `keys` that `lost` names, as the backend no longer holds their
/// lease: cancelled or taken over while running.
fn stop_lost(
    held: &mut HashMap<Key, Held>,
    timers: &mut DelayQueue<Key>,
    leases: &mut DelayQueue<Key>,
    keys: Vec<Key>,
    lost: &[JobId],
) {
    for key in keys.into_iter().filter(|k| lost.contains(&k.0)) {
        let Some(h) = held.get_mut(&key) else {
            continue;
        };
        if h.control.handed() || h.control.finished() || h.control.stopped() {
            continue;
        }
        h.control.stop();
        let lease = &h.lease;
        tracing::info!(queue = %lease.queue, id = %lease.job, attempt = lease.attempt, "job cancelled (or taken over) while running; handler stopped");
        // No more beats: kept until its `Ended`, as a lease that ran out.
        if let Some(timer) = h.timer.take() {
            timers.remove(&timer);
        }
        if let Some(until) = h.until.take() {
            leases.remove(&until);
        }
    }
}

/// [`Keeper::margin_less`] for a lease of `length` beaten every `every`; the run loop
/// uses it too, as the last moment a handed job may start (`Assigned::start_by`).
pub(super) fn margin_less(length: Duration, every: Duration) -> Duration {
    let after = length.saturating_sub(every);
    length.saturating_sub(every.min(after) / 2)
}
