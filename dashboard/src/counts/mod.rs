//! Queue counts for the pages and `/metrics`: exact and live where counting is cheap,
//! served from the last count where it is slow.
//!
//! `queue_stats` counts a queue's jobs per state. On a big queue that reads every row:
//! 0.3–0.4 s on PostgreSQL and 0.5–0.9 s on SQLite at 1,000,000 jobs
//! (docs/BENCHMARKS.md section 9), and an open page asks once a second. Counters kept by
//! every claim and settle would put a write on the paths kept lean so that they hold up
//! while vacuum is held back; River UI met the same problem with a count that runs in
//! the background and a cached answer (riverui#655), and this does the same:
//!
//! - a queue whose last count took under [`CHEAP`] is counted again for every request,
//!   so small queues stay exact and live;
//! - a slower one is answered at once from its last count, marked with when that count
//!   was taken, and counted again in the background once the answer is older than ten
//!   times what the count took (1 s to 30 s), one count per queue at a time;
//! - a queue never counted waits for its first count up to [`WAIT`], then answers
//!   "counting" (no figures) while the count goes on.
//!
//! So no request waits longer than [`WAIT`] for counts, and however many pages poll, a
//! queue is counted at most once per ten times its count's time while a count takes
//! up to 3 s (a tenth of one connection), and once per 30 s beyond.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use relayq_core::{Backend, QueueStats};
use tokio::sync::watch;

use crate::error::ApiError;

/// A count that took less is redone for every request.
pub(crate) const CHEAP: Duration = Duration::from_millis(25);
/// The longest a request waits for a count in progress.
pub(crate) const WAIT: Duration = Duration::from_millis(50);
/// The bounds of how long a slow count's answer is reused.
const MIN_REUSE: Duration = Duration::from_secs(1);
const MAX_REUSE: Duration = Duration::from_secs(30);
/// How many queues' counts are kept.
const MAX_QUEUES: usize = 1000;
/// A count that takes longer is given up on, and answered as an error.
const COUNT_LIMIT: Duration = Duration::from_secs(60);

/// One finished count.
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    pub(crate) stats: QueueStats,
    /// When the count was taken (the server's clock), for the page to show its age.
    pub(crate) at: DateTime<Utc>,
    started: Instant,
    took: Duration,
    /// Set by an action of this dashboard: count again at the next request.
    stale: bool,
}

impl Counted {
    /// Whether this answer may still be given without a new count.
    fn reusable(&self) -> bool {
        let reuse = if self.took < CHEAP {
            Duration::ZERO
        } else {
            (self.took * 10).clamp(MIN_REUSE, MAX_REUSE)
        };
        !self.stale && self.started.elapsed() < reuse
    }
}

/// What a request gets: a count, or "counting" when the first is not done yet.
pub(crate) type Answer = Result<Option<Counted>, ApiError>;

/// What an action of this dashboard changed in a queue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change {
    Paused(bool),
    MaxRunning(Option<u32>),
    /// Jobs moved (cancel, retry): the next count brings them.
    Jobs,
}

impl Change {
    fn apply(self, stats: &mut QueueStats) {
        match self {
            Self::Paused(paused) => stats.paused = paused,
            Self::MaxRunning(max) => stats.max_running = max,
            Self::Jobs => {}
        }
    }
}

#[derive(Default)]
struct Entry {
    last: Option<Result<Counted, ApiError>>,
    /// Set while a count runs; bumped when it ends.
    running: Option<watch::Receiver<u64>>,
    /// Actions since the running count began: it read the queue before them, so they
    /// are applied to what it brings.
    changes: Vec<Change>,
    /// Samples of the counts, for the charts.
    history: history::History,
}

/// The counts of every queue this dashboard has shown.
pub(crate) struct Counts {
    backend: Arc<dyn Backend>,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Counts {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            entries: Arc::default(),
        }
    }

    /// The counts of `queue`, as the module's rules give them.
    pub(crate) async fn get(&self, queue: &str) -> Answer {
        self.get_many(&[queue.to_owned()])
            .await
            .pop()
            .unwrap_or(Ok(None))
    }

    /// The counts of each of `queues`, in order. Counts that must run start together,
    /// and the waits share one deadline, so a list of many queues waits [`WAIT`] at
    /// most, not once per queue. A queue whose last count failed answers that error
    /// until a count succeeds: an outage shows, rather than old figures.
    pub(crate) async fn get_many(&self, queues: &[String]) -> Vec<Answer> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let waits: Vec<Option<watch::Receiver<u64>>> =
            queues.iter().map(|q| self.start_if_due(q)).collect();
        for mut rx in waits.into_iter().flatten() {
            // A count that ends, or one that outlives the deadline: either way go on.
            let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
        }
        let entries = self.lock();
        queues
            .iter()
            .map(|q| match entries.get(q).and_then(|e| e.last.clone()) {
                None => Ok(None),
                Some(Ok(counted)) => Ok(Some(counted)),
                Some(Err(e)) => Err(e),
            })
            .collect()
    }

    /// Starts the due counts of `queues` (as [`get_many`](Self::get_many) would) and
    /// waits up to `wait` for every count of them that runs, a slow queue's too: the
    /// sampler's pace, so that it never has more than `queues` counts running at once
    /// but for one that outlasts `wait`.
    pub(crate) async fn count_due(&self, queues: &[String], wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        let running: Vec<watch::Receiver<u64>> = queues
            .iter()
            .filter_map(|q| {
                self.start_if_due(q);
                self.lock().get(q).and_then(|e| e.running.clone())
            })
            .collect();
        for mut rx in running {
            let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
        }
    }

    /// Starts a count of `queue` unless its last one may still be reused or one is
    /// running. Returns what to wait on: the running count, when the last answer is
    /// missing, failed or cheap (so a cheap queue is answered exactly); nothing when a
    /// slow queue's last answer will do.
    fn start_if_due(&self, queue: &str) -> Option<watch::Receiver<u64>> {
        let mut entries = self.lock();
        if entries.len() >= MAX_QUEUES && !entries.contains_key(queue) {
            // Names come from URLs: forget idle cheap ones first (a recount costs
            // little), and only then the slow ones, rather than grow without bound.
            entries.retain(|_, e| {
                e.running.is_some() || matches!(&e.last, Some(Ok(c)) if c.took >= CHEAP)
            });
            if entries.len() >= MAX_QUEUES {
                entries.retain(|_, e| e.running.is_some());
            }
        }
        let entry = entries.entry(queue.to_owned()).or_default();
        let wait_for_it = match &entry.last {
            Some(Ok(last)) if last.reusable() => return None,
            Some(Ok(last)) => last.took < CHEAP,
            None | Some(Err(_)) => true,
        };
        let rx = match &entry.running {
            Some(rx) => rx.clone(),
            None => {
                let (tx, rx) = watch::channel(0);
                entry.running = Some(rx.clone());
                // The new count reads the queue after every action so far.
                entry.changes.clear();
                self.spawn_count(queue.to_owned(), tx);
                rx
            }
        };
        wait_for_it.then_some(rx)
    }

    fn spawn_count(&self, queue: String, done: watch::Sender<u64>) {
        let backend = Arc::clone(&self.backend);
        let entries = Arc::clone(&self.entries);
        tokio::spawn(async move {
            let started = Instant::now();
            let at = Utc::now();
            // On a task of its own, so that a count that panics or hangs still ends
            // this one, which marks the queue free to count again.
            let q = queue.clone();
            let mut count = tokio::spawn(async move { backend.queue_stats(&q).await });
            let result = match tokio::time::timeout(COUNT_LIMIT, &mut count).await {
                Ok(Ok(stats)) => stats.map_err(ApiError::from),
                Ok(Err(_)) => Err(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("counting queue {queue:?} failed"),
                )),
                Err(_) => {
                    count.abort();
                    Err(ApiError::status(
                        StatusCode::GATEWAY_TIMEOUT,
                        format!("counting queue {queue:?} took over {COUNT_LIMIT:?}"),
                    ))
                }
            };
            {
                let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = entries.entry(queue).or_default();
                if let Ok(stats) = &result {
                    entry.history.record(at, stats);
                }
                entry.last = Some(result.map(|mut stats| {
                    for change in &entry.changes {
                        change.apply(&mut stats);
                    }
                    Counted {
                        stats,
                        at,
                        started,
                        took: started.elapsed(),
                        // It missed the jobs those actions moved: count again soon.
                        stale: !entry.changes.is_empty(),
                    }
                }));
                entry.running = None;
            }
            done.send_modify(|n| *n += 1);
        });
    }

    /// After an action of this dashboard changed `queue`: the settings it set show at
    /// once, also over a count that was running, and the next request counts again.
    pub(crate) fn changed(&self, queue: &str, change: Change) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(queue) else {
            return;
        };
        if let Some(Ok(last)) = entry.last.as_mut() {
            change.apply(&mut last.stats);
            last.stale = true;
        }
        if entry.running.is_some() {
            entry.changes.push(change);
        }
    }

    /// The samples of `queue`'s counts so far, oldest first.
    pub(crate) fn history(&self, queue: &str) -> Vec<history::Sample> {
        self.lock()
            .get(queue)
            .map(|e| e.history.samples(Utc::now()))
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) mod history;
pub(crate) mod sampler;
#[cfg(test)]
mod tests;
