//! The worker's claim loop (SPEC W1, W2, W4, W5).

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{broadcast, mpsc},
    task::JoinSet,
    time::sleep,
};
use tokio_util::sync::CancellationToken;

use super::{
    Config, Worker, WorkerReport,
    job::{JobRun, Settling, Slots},
    settler::Settler,
    stats::Stats,
};
use crate::{Backend, ClaimRequest, Event, EventKind, Result};

pub(super) struct Runner {
    backend: Arc<dyn Backend>,
    queues: Vec<String>,
    config: Config,
    stats: Arc<Stats>,
    jobs: JoinSet<()>,
    template: JobRun,
    settle_rx: Option<mpsc::Receiver<Settling>>,
    /// Index of the queue the next round starts with (SPEC W5).
    next_queue: usize,
}

impl Runner {
    pub(super) fn new(w: Worker) -> Self {
        let (tx, rx) = mpsc::channel(w.config.concurrency as usize * 2 + 16);
        let heartbeat_every = w
            .config
            .heartbeat
            .unwrap_or(w.config.lease / 3)
            .max(Duration::from_millis(1));
        Self {
            template: JobRun {
                backend: w.backend.clone(),
                handler: w.handler,
                lease_length: w.config.lease,
                heartbeat_every,
                timeout: w.config.timeout,
                abort: CancellationToken::new(),
                settle: tx,
                slots: Slots::default(),
            },
            backend: w.backend,
            queues: w.queues,
            config: w.config,
            stats: Arc::new(Stats::default()),
            jobs: JoinSet::new(),
            settle_rx: Some(rx),
            next_queue: 0,
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<WorkerReport> {
        let settler = Settler {
            backend: self.backend.clone(),
            max_batch: self.config.settle_batch,
            delay: self.config.settle_delay,
            stats: self.stats.clone(),
        };
        let settler = tokio::spawn(settler.run(self.settle_rx.take().expect("taken once")));
        let mut events = self.backend.subscribe();
        let mut idle = self.config.poll_min;
        tracing::info!(worker = %self.config.name, queues = ?self.queues, "worker started");

        while !shutdown.is_cancelled() {
            // Reap job tasks that ended (their slots were freed already).
            while self.jobs.try_join_next().is_some() {}
            let free = self.free_slots();
            if free > 0 {
                let (claimed, failed) = self.claim_round(free).await;
                if claimed > 0 {
                    idle = self.config.poll_min;
                    if claimed == free {
                        // Every slot asked for was filled: there is likely more work.
                        continue;
                    }
                } else if failed {
                    idle = (idle * 2).min(self.config.poll_max);
                }
            }
            let free = self.free_slots();
            let freed = self.template.slots.freed.clone();
            tokio::select! {
                // A handler returned: claim again at once for the freed slots (SPEC W1).
                () = freed.notified() => {}
                woke = next_event(&mut events, &self.queues), if free > 0 => {
                    if woke { idle = self.config.poll_min; }
                }
                () = sleep(idle), if free > 0 => idle = (idle * 2).min(self.config.poll_max),
                () = shutdown.cancelled() => {}
            }
        }
        self.shut_down().await;
        settler.await.ok();
        let report = self.stats.report();
        tracing::info!(worker = %self.config.name, ?report, "worker stopped");
        Ok(report)
    }

    fn free_slots(&self) -> u32 {
        self.config
            .concurrency
            .saturating_sub(self.template.slots.busy())
    }

    /// Claims up to `free` jobs, asking the queues in turn from `next_queue` on; the next
    /// round starts one queue later (SPEC W5). Returns (jobs claimed, a claim failed).
    async fn claim_round(&mut self, free: u32) -> (u32, bool) {
        let n = self.queues.len();
        let start = self.next_queue;
        self.next_queue = (start + 1) % n;
        let (mut claimed, mut failed) = (0, false);
        for i in 0..n {
            let want = free - claimed;
            if want == 0 {
                break;
            }
            let queue = &self.queues[(start + i) % n];
            let req = ClaimRequest::new(
                queue.clone(),
                self.config.name.clone(),
                want,
                self.config.lease,
            );
            match self.backend.claim(req).await {
                Ok(jobs) => {
                    claimed += u32::try_from(jobs.len()).unwrap_or(u32::MAX);
                    self.stats.add_claimed(jobs.len());
                    for job in jobs {
                        self.jobs.spawn(self.template.clone_for_job().start(job));
                    }
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(queue = %queue, error = %e, "claim failed; backing off");
                }
            }
        }
        (claimed, failed)
    }

    /// SPEC W4: let running handlers finish until the deadline, then release the rest.
    async fn shut_down(&mut self) {
        let drain = async { while self.jobs.join_next().await.is_some() {} };
        if tokio::time::timeout(self.config.shutdown_timeout, drain)
            .await
            .is_err()
        {
            tracing::info!(
                left = self.jobs.len(),
                "shutdown deadline passed; releasing running jobs"
            );
            self.template.abort.cancel();
            while self.jobs.join_next().await.is_some() {}
        }
        // Closing the last sender lets the settler flush and stop.
        drop(std::mem::replace(
            &mut self.template.settle,
            mpsc::channel(1).0,
        ));
    }
}

impl JobRun {
    fn clone_for_job(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            handler: self.handler.clone(),
            lease_length: self.lease_length,
            heartbeat_every: self.heartbeat_every,
            timeout: self.timeout,
            abort: self.abort.clone(),
            settle: self.settle.clone(),
            slots: self.slots.clone(),
        }
    }
}

/// Waits for an event about one of `queues`; true on such an event (or a lag, which may
/// have hidden one). Without events, or once the channel closes, never returns.
async fn next_event(events: &mut Option<broadcast::Receiver<Event>>, queues: &[String]) -> bool {
    let Some(rx) = events.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(ev) if ev.kind == EventKind::Resync || queues.iter().any(|q| **q == *ev.queue) => {
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
