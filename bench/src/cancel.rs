//! Scenario 9: cancel to handler stop (SPEC B8). A worker runs `RUNNING` jobs that wait
//! to be stopped; another handle cancels one at a time, and each cancel is timed from
//! just before the call to the moment the handler's `JobContext` token fires. Each
//! cancelled job is replaced, so the worker always holds `RUNNING` leases. Then the
//! same for a purge of the queue (SPEC B9): `RUNNING` jobs started, the queue purged,
//! each handler's stop timed from just before the call.
//!
//! Two paths per target: the one the backend has ("pushed": NOTIFY, PUBLISH, or the
//! process's own bus where the two handles share one, as SQLite's and SQL Server's do),
//! and the lease read alone ("read"), as a worker in another process than the
//! canceller gets it on SQLite and SQL Server: its handle hears no events.

use std::{sync::Arc, time::Duration};

use relayq::{
    Backend, ClaimedJob, Events, JobId, NewJob,
    worker::{JobContext, JobError, RunningWorker, Worker},
};
use tokio::{sync::mpsc, time::Instant};

use crate::{Row, phases::percentile, targets::Target};

/// Jobs running while the cancels are made.
const RUNNING: u32 = 16;

/// A handle that hears nothing: the worker learns of cancels by reading its leases.
struct Deaf(Arc<dyn Backend>);

relayq::delegate!(Deaf, 0 => Enqueue, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

impl Events for Deaf {}

pub async fn cancel(targets: &[Target], n: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        for path in ["pushed", "read"] {
            let (worker_handle, canceller) = t.open_pair().await?;
            let worker_handle: Arc<dyn Backend> = if path == "read" {
                Arc::new(Deaf(worker_handle))
            } else {
                worker_handle
            };
            let cancels = measure(worker_handle.clone(), canceller.clone(), n).await?;
            let rounds = n.div_ceil(RUNNING as usize);
            let purges = measure_purge(worker_handle, canceller, rounds).await?;
            for (op, ms) in [("cancel", cancels), ("purge", purges)] {
                for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
                    let row = Row {
                        scenario: format!(
                            "{op} to handler stop ({path}), {RUNNING} running: {what}"
                        ),
                        target: t.label().to_owned(),
                        value: percentile(ms.clone(), p),
                        unit: "ms",
                        note: format!("{} handlers stopped", ms.len()),
                    };
                    crate::print(std::slice::from_ref(&row));
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

async fn measure(
    worker_handle: Arc<dyn Backend>,
    canceller: Arc<dyn Backend>,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let q = crate::scenarios::queue("cancel");
    let (worker, mut started, mut stopped) = waiting_worker(worker_handle, &q)?;
    let job = || NewJob::new(&q, b"wait".to_vec());
    canceller
        .enqueue((0..RUNNING).map(|_| job()).collect())
        .await?;
    let mut running = Vec::new();
    for _ in 0..RUNNING {
        running.push(next(&mut started).await?);
    }
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let id = running.swap_remove(i % running.len());
        let asked = Instant::now();
        canceller.cancel_job(&q, id).await?;
        let (stopped_id, at) = tokio::time::timeout(Duration::from_secs(30), stopped.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the worker ended"))?;
        anyhow::ensure!(stopped_id == id, "job {stopped_id} stopped, not {id}");
        ms.push(at.duration_since(asked).as_secs_f64() * 1e3);
        canceller.enqueue(vec![job()]).await?;
        running.push(next(&mut started).await?);
    }
    worker.shutdown().await?;
    Ok(ms)
}

/// `rounds` purges of a queue whose worker runs `RUNNING` jobs; each handler's stop, in
/// ms after its purge began.
async fn measure_purge(
    worker_handle: Arc<dyn Backend>,
    canceller: Arc<dyn Backend>,
    rounds: usize,
) -> anyhow::Result<Vec<f64>> {
    let q = crate::scenarios::queue("purge");
    let (worker, mut started, mut stopped) = waiting_worker(worker_handle, &q)?;
    let mut ms = Vec::with_capacity(rounds * RUNNING as usize);
    // One round more, first and not counted: a fresh handle's first purge opens its
    // connections and plans its statements.
    for round in 0..=rounds {
        let jobs = (0..RUNNING)
            .map(|_| NewJob::new(&q, b"wait".to_vec()))
            .collect();
        canceller.enqueue(jobs).await?;
        for _ in 0..RUNNING {
            next(&mut started).await?;
        }
        let asked = Instant::now();
        let n = canceller.purge(&q).await?;
        anyhow::ensure!(n == u64::from(RUNNING), "the purge cancelled {n} jobs");
        for _ in 0..RUNNING {
            let (_, at) = tokio::time::timeout(Duration::from_secs(30), stopped.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("the worker ended"))?;
            if round > 0 {
                ms.push(at.duration_since(asked).as_secs_f64() * 1e3);
            }
        }
    }
    worker.shutdown().await?;
    Ok(ms)
}

/// Jobs as their handlers start.
type Started = mpsc::UnboundedReceiver<JobId>;
/// Jobs, and when their handlers were stopped.
type Stopped = mpsc::UnboundedReceiver<(JobId, Instant)>;

/// A worker of `RUNNING` slots on `q` whose handlers wait to be stopped: each sends its
/// job on the first channel as it starts, and its job and the moment on the second
/// when its `JobContext` token fires.
fn waiting_worker(
    handle: Arc<dyn Backend>,
    q: &str,
) -> anyhow::Result<(RunningWorker, Started, Stopped)> {
    let (started_tx, started) = mpsc::unbounded_channel::<JobId>();
    let (stopped_tx, stopped) = mpsc::unbounded_channel::<(JobId, Instant)>();
    let worker = Worker::builder(handle, [q.to_owned()])
        .concurrency(RUNNING)
        .prefetch(0)
        .no_maintenance()
        .no_schedules()
        // Its handlers never end: shutdown releases them at once.
        .shutdown_timeout(Duration::from_millis(100))
        .handler(move |job: ClaimedJob| {
            let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
            async move {
                let token = JobContext::current().expect("in a handler").stopping();
                let id = job.lease.job;
                tokio::spawn(async move {
                    token.cancelled().await;
                    let _ = stopped_tx.send((id, Instant::now()));
                });
                let _ = started_tx.send(id);
                std::future::pending::<Result<(), JobError>>().await
            }
        })
        .build()?
        .spawn();
    Ok((worker, started, stopped))
}

async fn next(started: &mut mpsc::UnboundedReceiver<JobId>) -> anyhow::Result<JobId> {
    tokio::time::timeout(Duration::from_secs(30), started.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the worker ended"))
}
