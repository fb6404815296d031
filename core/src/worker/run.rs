//! The worker's claim loop (SPEC W1, W2, W4, W5).
//!
//! Claims run beside the loop, which keeps serving while they are in flight: slots that
//! free meanwhile are filled from the prefetch buffer, and expired buffered jobs are
//! released on time. With prefetch off (`prefetch(0)`) one claim is in flight at a time
//! (SPEC W1); otherwise (a fixed prefetch, or the automatic one, `pace`) two, so one
//! claim's round trip hides behind the other's.
//!
//! The loop also tells the settler when the worker runs dry (nothing running or
//! buffered, the last claim short), so that outcomes are not held back for company.

use std::{panic::AssertUnwindSafe, pin::Pin, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt, stream::FuturesUnordered};
use tokio::{
    sync::{broadcast, mpsc, watch},
    task::JoinSet,
    time::{Instant, sleep, sleep_until},
};
use tokio_util::sync::CancellationToken;

use super::{
    Config, Worker, WorkerReport,
    buffer::Buffer,
    control::{Control, Ended, Msg, Settling},
    job::{Assigned, JobRun},
    keeper::{self, Keeper},
    maintainer::Maintainer,
    pace::Pace,
    scheduler::Scheduler,
    settler::{self, Settler},
    slots::Pool,
    stats::Stats,
};
use crate::{Backend, ClaimRequest, ClaimedJob, Error, Event, EventKind, Result, Settle, validate};

/// What one claim round brought back.
struct Claimed {
    /// Each job with when its queue's claim was sent: a round claims queue after
    /// queue, and a job's wait in the buffer counts from its own claim.
    jobs: Vec<(Instant, ClaimedJob)>,
    asked: u32,
    failed: bool,
    at: Instant,
    /// Queues (by index) whose rate cut their claim short, with when it lets the
    /// next job start (SPEC K10).
    paced: Vec<(usize, Instant)>,
    /// The earliest time a limit key's rate lets a job it held back start (SPEC K13).
    wake: Option<Instant>,
}

type Claiming = Pin<Box<dyn Future<Output = Claimed> + Send>>;

/// The soonest an idle worker claims again for a limit key's wake (SPEC K13).
const WAKE_FLOOR: Duration = Duration::from_millis(1);

pub(super) struct Runner {
    backend: Arc<dyn Backend>,
    queues: Arc<[String]>,
    config: Config,
    stats: Arc<Stats>,
    /// What every slot runs its jobs with.
    template: JobRun,
    /// The slots, started when the worker runs.
    pool: Option<Pool>,
    settle_rx: Option<mpsc::Receiver<Settling>>,
    /// Tells the keeper which jobs started, so it heartbeats their leases.
    keeper: mpsc::UnboundedSender<Msg>,
    keeper_rx: Option<mpsc::UnboundedReceiver<Msg>>,
    heartbeat_every: Duration,
    buffer: Buffer,
    /// The pace the automatic prefetch follows.
    pace: Pace,
    /// Jobs asked for by the claims in flight.
    asking: u32,
    /// Index of the queue the next round starts with (SPEC W5).
    next_queue: usize,
    /// Whether the last claim that came back brought fewer jobs than it asked for.
    short: bool,
    /// Tells the settler whether the worker has run dry.
    dry: watch::Sender<bool>,
    /// How many jobs of each queue (in `queues`' order) wait in the buffer, for the
    /// worker's beat to each queue.
    held: Arc<[std::sync::atomic::AtomicU32]>,
    /// Per queue (in `queues`' order): until when its rate allows no start. Claims
    /// skip the queue until then, and the worker sleeps till then instead of polling.
    paced: Vec<Option<Instant>>,
    /// When a limit key's rate lets a job it held back start: an idle worker claims
    /// again then instead of waiting for its next poll (SPEC K13).
    wake: Option<Instant>,
}

impl Runner {
    pub(super) fn new(w: Worker) -> Self {
        let (tx, rx) = mpsc::channel(w.config.concurrency as usize * 2 + 16);
        let (keeper, keeper_rx) = mpsc::unbounded_channel();
        let heartbeat_every = w
            .config
            .heartbeat
            .unwrap_or(w.config.lease / 3)
            .max(Duration::from_millis(1));
        let stats = Arc::new(Stats::new(&w.config.name));
        let n_queues = w.queues.len();
        Self {
            template: JobRun {
                handler: w.handler,
                timeout: w.config.timeout,
                abort: CancellationToken::new(),
                settle: tx,
                max_result: w.config.max_result,
            },
            pool: None,
            backend: w.backend,
            queues: w.queues.into(),
            config: w.config,
            stats,
            settle_rx: Some(rx),
            keeper,
            keeper_rx: Some(keeper_rx),
            heartbeat_every,
            buffer: Buffer::new(heartbeat_every),
            pace: Pace::new(Instant::now(), heartbeat_every),
            asking: 0,
            next_queue: 0,
            short: false,
            dry: watch::Sender::new(false),
            held: (0..n_queues)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
            paced: vec![None; n_queues],
            wake: None,
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<WorkerReport> {
        let keeper = Keeper {
            backend: self.backend.clone(),
            length: self.config.lease,
            every: self.heartbeat_every,
            stats: self.stats.clone(),
            watch: Some(super::revoke::Watch::new(
                &*self.backend,
                self.config.cancel_poll,
            )),
        };
        let keeper = tokio::spawn(keeper.run(self.keeper_rx.take().expect("taken once")));
        let settler = Settler {
            backend: self.backend.clone(),
            max_batch: self.config.settle_batch,
            delay: self.config.settle_delay,
            stats: self.stats.clone(),
            dry: self.dry.subscribe(),
        };
        let settler = tokio::spawn(settler.run(self.settle_rx.take().expect("taken once")));
        let maintenance_stop = CancellationToken::new();
        let maintainer = self.config.maintenance.map(|schedule| {
            let m = Maintainer {
                backend: self.backend.clone(),
                queues: self.queues.clone(),
                schedule,
                worker: self.config.name.clone(),
            };
            tokio::spawn(m.run(maintenance_stop.clone()))
        });
        let scheduler = self.config.schedules.then(|| {
            let s = Scheduler {
                backend: self.backend.clone(),
                queues: self.queues.clone(),
                worker: self.config.name.clone(),
            };
            tokio::spawn(s.run(maintenance_stop.clone()))
        });
        self.pool = Some(Pool::start(
            self.config.concurrency as usize,
            &self.template,
            &self.config.name,
        ));
        let slots = self.pool().shared.clone();
        let beater = super::beat::Beater {
            backend: self.backend.clone(),
            queues: self.queues.clone(),
            worker: self.config.name.clone(),
            slots: self.config.concurrency,
            shared: slots.clone(),
            held: self.held.clone(),
            started_at: chrono::Utc::now(),
        };
        let beating = tokio::spawn(beater.run(maintenance_stop.clone()));
        let mut events = self.backend.subscribe();
        let mut idle = self.config.poll_min;
        // Claim without waiting: set when there is likely work (start, a freed slot, an
        // event, a poll tick, a full claim), cleared when a claim came back short.
        let mut eager = true;
        let mut claiming: FuturesUnordered<Claiming> = FuturesUnordered::new();
        let mut releasing = JoinSet::new();
        let max_claims = if self.config.prefetch == Some(0) {
            1
        } else {
            2
        };
        tracing::info!(worker = %self.config.name, queues = ?self.queues, "worker started");

        loop {
            if shutdown.is_cancelled() {
                break;
            }
            // Before jobs start: a job that ends at once must not find the worker dry.
            self.tell_dry();
            // Free slots first: a job is released only if no slot could take it in time.
            self.start_buffered();
            self.count_held();
            // Given back on tasks of their own: the loop must keep serving (and hear a
            // shutdown) while a server that does not answer holds a release up.
            let expired = self.buffer.take_expired(Instant::now());
            if !expired.is_empty() {
                let (backend, stats) = (self.backend.clone(), self.stats.clone());
                releasing.spawn(async move { release(&*backend, &stats, expired).await });
            }
            while releasing.try_join_next().is_some() {}
            self.tell_dry();
            let want = self.want();
            if eager && want > 0 && self.all_paced() {
                // Nothing to ask until a rate allows a start: wait for that.
                eager = false;
            }
            if claiming.len() < max_claims && eager && want > 0 {
                let slots = self.start_now();
                claiming.push(self.claim_round(want, slots));
                continue;
            }
            // Nothing in flight and room for work: wait for an event or a poll tick.
            let waiting = claiming.is_empty() && want > 0;
            let expiry = self.buffer.next_expiry();
            tokio::select! {
                Some(got) = claiming.next(), if !claiming.is_empty() => {
                    self.asking -= got.asked;
                    let now = Instant::now();
                    self.pace.claimed(now.saturating_duration_since(got.at), now);
                    let n = u32::try_from(got.jobs.len()).unwrap_or(u32::MAX);
                    // At most `poll_max` ahead, so a rate lifted or raised meanwhile is
                    // seen as soon as an idle worker would see new work.
                    let cap = now + self.config.poll_max;
                    for (i, until) in got.paced {
                        self.paced[i] = Some(until.min(cap));
                    }
                    // At least a millisecond ahead: a wake of now must not become a
                    // loop of claims.
                    if let Some(at) = got.wake.map(|at| at.max(now + WAKE_FLOOR)) {
                        self.wake = Some(self.wake.map_or(at, |w| w.min(at)).min(cap));
                    }
                    self.buffer.push(got.jobs);
                    eager = n == got.asked;
                    self.short = !eager;
                    if n > 0 {
                        idle = self.config.poll_min;
                    } else if got.failed {
                        idle = (idle * 2).min(self.config.poll_max);
                    }
                }
                // A handler returned: claim again at once for the freed slot (SPEC W1).
                () = slots.freed.notified() => eager = true,
                woke = next_event(&mut events, &self.queues), if waiting => {
                    eager = true;
                    if woke { idle = self.config.poll_min; }
                }
                () = sleep(idle), if waiting => {
                    eager = true;
                    idle = (idle * 2).min(self.config.poll_max);
                }
                () = sleep_until(self.next_paced().unwrap_or_else(Instant::now)),
                    if waiting && self.next_paced().is_some() => eager = true,
                () = sleep_until(self.wake.unwrap_or_else(Instant::now)),
                    if waiting && self.wake.is_some() => {
                    self.wake = None;
                    eager = true;
                }
                () = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => {}
                () = shutdown.cancelled() => {}
            }
        }
        maintenance_stop.cancel();
        if let Some(m) = maintainer {
            m.await.ok();
        }
        if let Some(s) = scheduler {
            s.await.ok();
        }
        beating.await.ok();
        // Each step that waits on the server gets at most the shutdown timeout: a server
        // that stops answering (a SQLite file whose write lock a frozen process holds, a
        // network gone) must not hold the process past SIGTERM for ever. What is not
        // stored by then is left to its lease: the job runs again (SPEC W4).
        let patience = self.config.shutdown_timeout;
        // A claim in flight is finished, not dropped: its jobs are leased on the server
        // and must be released, not left to expire (SPEC W4).
        let handed_back = tokio::time::timeout(patience, async {
            while let Some(got) = claiming.next().await {
                self.buffer.push(got.jobs);
            }
            let buffered = self.buffer.take_all();
            release(&*self.backend, &self.stats, buffered).await;
            while releasing.join_next().await.is_some() {}
        })
        .await;
        if handed_back.is_err() {
            tracing::warn!(worker = %self.config.name, "shutdown: claims and releases did not finish in time; those jobs wait for their leases");
        }
        self.shut_down().await;
        let (settler_abort, keeper_abort) = (settler.abort_handle(), keeper.abort_handle());
        let (keeper_tx, template) = (self.keeper, self.template);
        let stored = tokio::time::timeout(patience, async move {
            settler.await.ok();
            // The settler is done and every job has ended: no lease is left to beat.
            drop(keeper_tx);
            drop(template);
            keeper.await.ok();
        })
        .await;
        if stored.is_err() {
            settler_abort.abort();
            keeper_abort.abort();
            tracing::warn!(worker = %self.config.name, "shutdown: outcomes not stored in time; their jobs run again once their leases end");
        }
        // Whatever was given up on above ended without an outcome.
        let report = self.stats.report();
        self.stats.add_lost(
            usize::try_from(report.claimed.saturating_sub(report.ended())).unwrap_or(0),
            "no_outcome",
        );
        let report = self.stats.report();
        tracing::info!(worker = %self.config.name, ?report, "worker stopped");
        Ok(report)
    }

    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("started with the worker")
    }

    fn pool_mut(&mut self) -> &mut Pool {
        self.pool.as_mut().expect("started with the worker")
    }

    fn busy(&self) -> u32 {
        self.pool.as_ref().map_or(0, |p| p.shared.busy())
    }

    fn free_slots(&self) -> u32 {
        self.config.concurrency.saturating_sub(self.busy())
    }

    /// Tells the settler whether the worker has run dry: no job running or buffered,
    /// and its last claim came back short. The settler then stores outcomes at once
    /// instead of holding them for company that is not coming.
    fn tell_dry(&self) {
        let dry = self.short && self.buffer.len() == 0 && self.busy() == 0;
        if *self.dry.borrow() != dry {
            self.dry.send_replace(dry);
        }
    }

    /// How many jobs to claim now; 0 for none.
    ///
    /// Without prefetch this is the free slots (SPEC W1). With it, a claim also tops the
    /// buffer up to `prefetch`, once a free slot found it empty or, while jobs are
    /// leaving it, once it is down to half. Jobs asked for by claims in flight count as
    /// buffered.
    fn want(&self) -> u32 {
        let prefetch = self.config.prefetch.unwrap_or_else(|| self.pace.target());
        let buffered = self.buffer.len() + self.asking;
        let free = self.free_slots().saturating_sub(self.buffer.len());
        let refill = prefetch > 0 && buffered <= prefetch / 2 && self.buffer.consumed();
        if free == 0 && !refill {
            return 0;
        }
        (free + prefetch)
            .saturating_sub(buffered)
            .min(validate::MAX_CLAIM_LIMIT)
    }

    /// How many of the jobs claimed now would start at once: free slots that neither
    /// the buffer nor claims in flight will fill. The rest are claimed ahead, and never
    /// take a limit key's last slot (SPEC K6).
    fn start_now(&self) -> u32 {
        self.free_slots()
            .saturating_sub(self.buffer.len())
            .saturating_sub(self.asking)
    }

    /// Moves buffered jobs into free slots, oldest first.
    fn start_buffered(&mut self) {
        // Only while the oldest job may still start: the others go back (`take_expired`).
        while self.buffer.startable(Instant::now()) {
            let Some(slot) = self.pool().take() else {
                break;
            };
            // (Dropping an unused slot gives it back.)
            let Some((claimed_at, job)) = self.buffer.pop(Instant::now()) else {
                break;
            };
            self.pace.started();
            let control = Arc::new(Control::default());
            let ended = Ended::new(self.keeper.clone(), &job.lease);
            // Heartbeats are timed from the claim: a job that waited in the prefetch
            // buffer is renewed on the same schedule as any other.
            if self
                .keeper
                .send(Msg::Started {
                    lease: job.lease.clone(),
                    claimed_at,
                    control: control.clone(),
                })
                .is_err()
            {
                tracing::error!(
                    "the heartbeat keeper is gone; this job's lease will not be renewed"
                );
            }
            let start_by =
                claimed_at + keeper::margin_less(self.config.lease, self.heartbeat_every);
            self.pool_mut().hand(Assigned {
                job,
                control,
                slot,
                ended,
                start_by,
                claimed_at,
            });
        }
    }

    /// Hands the buffer's count of held jobs per queue to the beat (the buffer keeps
    /// them as jobs come and go, so this costs a look-up per queue).
    fn count_held(&mut self) {
        for (held, queue) in self.held.iter().zip(self.queues.iter()) {
            let n = self.buffer.held_of(queue);
            held.store(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The earliest time a queue's rate lets it start a job again, if one waits.
    fn next_paced(&self) -> Option<Instant> {
        self.paced.iter().flatten().min().copied()
    }

    /// Forgets the waits that are over; whether every queue still waits for its rate.
    fn all_paced(&mut self) -> bool {
        let now = Instant::now();
        for p in &mut self.paced {
            if p.is_some_and(|until| until <= now) {
                *p = None;
            }
        }
        self.paced.iter().all(Option::is_some)
    }

    /// Claims up to `want` jobs, asking the queues in turn from `next_queue` on; the next
    /// round starts one queue later (SPEC W5). Queues whose rate allows nothing yet are
    /// not asked (SPEC K10).
    fn claim_round(&mut self, want: u32, slots: u32) -> Claiming {
        self.buffer.claim_started();
        let skip: Vec<bool> = self.paced.iter().map(Option::is_some).collect();
        self.asking += want;
        let start = self.next_queue;
        self.next_queue = (start + 1) % self.queues.len();
        let (backend, queues, stats) = (
            self.backend.clone(),
            self.queues.clone(),
            self.stats.clone(),
        );
        let (worker, lease) = (self.config.name.clone(), self.config.lease);
        Box::pin(async move {
            let at = Instant::now();
            let (mut jobs, mut failed, mut paced) = (Vec::new(), false, Vec::new());
            let mut wake: Option<Instant> = None;
            let n = queues.len();
            for i in 0..n {
                let taken = u32::try_from(jobs.len()).unwrap_or(want);
                let left = want - taken;
                if left == 0 {
                    break;
                }
                let index = (start + i) % n;
                if skip[index] {
                    continue;
                }
                let queue = &queues[index];
                let req = ClaimRequest::new(queue.clone(), worker.clone(), left, lease)
                    .with_slots(slots.saturating_sub(taken));
                // A backend that panics fails this claim, not the worker: its running
                // jobs are still settled or released.
                let sent = Instant::now();
                let claim = AssertUnwindSafe(backend.claim_paced(req)).catch_unwind();
                let claimed = claim
                    .await
                    .unwrap_or_else(|_| Err(Error::backend("claim panicked")));
                match claimed {
                    Ok(got) => {
                        stats.outage.succeeded();
                        stats.add_claimed(queue, got.jobs.len());
                        if let Some(wait) = got.next_in {
                            paced.push((index, Instant::now() + wait));
                        }
                        if let Some(wait) = got.wake_in {
                            let at = Instant::now() + wait;
                            wake = Some(wake.map_or(at, |w| w.min(at)));
                        }
                        jobs.extend(got.jobs.into_iter().map(|job| (sent, job)));
                    }
                    Err(e) => {
                        failed = true;
                        // One warning per outage (`outage.rs`), not one per retry.
                        stats
                            .outage
                            .failed("claim", &format!("claim from {queue:?}"), &e);
                    }
                }
            }
            Claimed {
                jobs,
                asked: want,
                failed,
                at,
                paced,
                wake,
            }
        })
    }

    /// SPEC W4: let running handlers finish until the deadline, then release the rest.
    async fn shut_down(&mut self) {
        let Some(mut pool) = self.pool.take() else {
            return;
        };
        // Each slot finishes its job and ends.
        pool.close();
        if tokio::time::timeout(self.config.shutdown_timeout, pool.join())
            .await
            .is_err()
        {
            tracing::info!(
                left = pool.shared.busy(),
                "shutdown deadline passed; releasing running jobs"
            );
            self.template.abort.cancel();
            pool.join().await;
        }
        // The pool holds a sender of outcomes too.
        drop(pool);
        // Closing the last sender lets the settler flush and stop.
        drop(std::mem::replace(
            &mut self.template.settle,
            mpsc::channel(1).0,
        ));
    }
}

/// Waits for an event about one of `queues`; true on such an event (or a lag, which may
/// have hidden one). Without events, or once the channel closes, never returns.
///
/// Events already queued behind it are dropped: the claim that follows sees what they
/// announce, so a burst (many enqueues, or one message copied by several servers) is
/// one wake-up and one claim, not one each.
async fn next_event(events: &mut Option<broadcast::Receiver<Event>>, queues: &[String]) -> bool {
    let Some(rx) = events.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(ev) if ev.kind == EventKind::Resync || queues.iter().any(|q| **q == *ev.queue) => {
                // Only those queued now: under a steady stream this still returns.
                for _ in 0..rx.len() {
                    if matches!(
                        rx.try_recv(),
                        Err(broadcast::error::TryRecvError::Empty
                            | broadcast::error::TryRecvError::Closed)
                    ) {
                        break;
                    }
                }
                return true;
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return true,
            Err(broadcast::error::RecvError::Closed) => {
                *events = None;
                return std::future::pending().await;
            }
        }
    }
}

/// Gives buffered jobs back, the attempt not counted (SPEC L4): in calls of at most
/// 1000, each retried like the settler's. If a call still fails the leases expire and
/// the jobs are claimed again (SPEC C5).
async fn release(backend: &dyn Backend, stats: &Stats, jobs: Vec<(Instant, ClaimedJob)>) {
    // Never started: the log's attempt starts as it ends (SPEC L5), not at the claim.
    let now = Instant::now();
    let (claimed, jobs): (Vec<Instant>, Vec<ClaimedJob>) = jobs.into_iter().unzip();
    for (chunk, at) in jobs
        .chunks(validate::MAX_SETTLE)
        .zip(claimed.chunks(validate::MAX_SETTLE))
    {
        let n = chunk.len();
        let settles: Vec<Settle> = chunk
            .iter()
            .zip(at)
            .map(|(j, at)| {
                Settle::release(j.lease.clone()).with_waited(now.saturating_duration_since(*at))
            })
            .collect();
        let results = settler::settle_retrying(backend, &settles).await;
        match results {
            Ok(results) => {
                let mut released = 0;
                for (job, result) in chunk.iter().zip(&results) {
                    if result.is_ok() {
                        stats.add_released(&job.lease.queue, 1);
                        released += 1;
                    }
                }
                stats.add_lost(n - released, "release_failed");
                tracing::debug!(jobs = n, released, "released buffered jobs");
            }
            Err(e) => {
                stats.add_lost(n, "release_failed");
                tracing::warn!(jobs = n, error = %e, "could not release buffered jobs; their leases will expire");
            }
        }
    }
}
