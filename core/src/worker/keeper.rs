//! Heartbeats for every started job of a worker, from one task (SPEC W1).
//!
//! A job is kept from the moment it starts until the settler has stored its outcome (or
//! given up on it): a slow settle must not let a finished job's lease expire and the job
//! run again. Each lease is extended every `every`, timed from its claim. When a
//! heartbeat finds the lease lost (cancelled, or expired and taken over), the job's task
//! is aborted, which stops its handler: someone else owns the job now.
//!
//! One task with one timer queue, rather than a timer task per job: short jobs end long
//! before their first beat, and then all a job costs here is two messages.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{sync::mpsc, task::AbortHandle, time::Instant};
use tokio_util::time::{DelayQueue, delay_queue};

use crate::{Backend, Error, JobId, Lease, LeaseToken};

/// What the keeper is told.
pub(super) enum Msg {
    /// A job started: beat its lease at `first`, then every `every`; abort its task if
    /// the lease is lost.
    Started {
        lease: Lease,
        first: Instant,
        task: AbortHandle,
    },
    /// A job's outcome was stored or given up on: stop beating its lease.
    Stored(JobId, LeaseToken),
}

type Key = (JobId, LeaseToken);

struct Held {
    lease: Lease,
    /// Its entry in the timer queue; `None` while a beat is in flight.
    due: Option<delay_queue::Key>,
    task: AbortHandle,
}

pub(super) struct Keeper {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) length: Duration,
    pub(super) every: Duration,
}

impl Keeper {
    /// Runs until every sender of `rx` is gone.
    pub(super) async fn run(self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut held: HashMap<Key, Held> = HashMap::new();
        let mut timers: DelayQueue<Key> = DelayQueue::new();
        // `Stored` may overtake its `Started` (they come from different tasks); a job
        // whose lease was lost may still be stored after. Entries older than a lease are
        // dropped: by then every `Started` has long arrived.
        let mut stored_early: HashMap<Key, Instant> = HashMap::new();
        let mut beating = FuturesUnordered::new();
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    None => break,
                    Some(Msg::Started { lease, first, task }) => {
                        let key = (lease.job, lease.token);
                        if stored_early.remove(&key).is_none() {
                            let due = Some(timers.insert_at(key, first));
                            held.insert(key, Held { lease, due, task });
                        }
                    }
                    Some(Msg::Stored(job, token)) => {
                        let key = (job, token);
                        match held.remove(&key) {
                            Some(h) => {
                                if let Some(due) = h.due {
                                    timers.remove(&due);
                                }
                            }
                            None => {
                                let now = Instant::now();
                                if stored_early.len() >= 64 {
                                    stored_early.retain(|_, at| now - *at < self.length);
                                }
                                stored_early.insert(key, now);
                            }
                        }
                    }
                },
                Some(expired) = timers.next(), if !timers.is_empty() => {
                    let key = expired.into_inner();
                    if let Some(h) = held.get_mut(&key) {
                        h.due = None;
                        let (backend, lease, length) = (self.backend.clone(), h.lease.clone(), self.length);
                        beating.push(async move { (key, backend.heartbeat(&lease, length).await) });
                    }
                }
                Some((key, result)) = beating.next(), if !beating.is_empty() => {
                    // Gone meanwhile: stored, so nothing to beat or abort.
                    let Some(h) = held.get_mut(&key) else { continue };
                    match result {
                        Err(Error::StaleLease) => {
                            h.task.abort();
                            let lease = &h.lease;
                            tracing::warn!(queue = %lease.queue, id = %lease.job, attempt = lease.attempt, "lease lost while running; handler stopped");
                            held.remove(&key);
                        }
                        other => {
                            if let Err(e) = other {
                                tracing::warn!(error = %e, "heartbeat failed; will retry");
                            }
                            h.due = Some(timers.insert(key, self.every));
                        }
                    }
                }
            }
        }
    }
}
