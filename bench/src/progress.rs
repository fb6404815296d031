//! Scenario 11: what progress reports cost a drain (SPEC L7). 1,000 jobs (250 in a
//! quick run), each running one second in ten steps, drain through one worker of
//! `SLOTS` slots: once
//! silent, once with every job reporting its progress at each step (ten reports a
//! second each). The worker writes each job's latest report at most once a second, in
//! one call for all its jobs, so the drain with reports should take about as long:
//! the row is the ratio of the two wall times.

use std::{sync::Arc, time::Duration};

use relayq::{
    Backend, ClaimedJob, NewJob,
    worker::{JobContext, JobError, Worker},
};
use tokio::time::Instant;

use crate::{Row, targets::Target};

/// The worker's slots: the drain takes about `JOBS / SLOTS` seconds.
const SLOTS: u32 = 250;
/// Steps of each job, one report each.
const STEPS: u8 = 10;
/// How long a step takes.
const STEP: Duration = Duration::from_millis(100);

pub async fn progress(targets: &[Target], jobs: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        let b = t.open().await?;
        // Silent first and last, so a drift of the machine over the run shows.
        let silent = drain(b.clone(), jobs, false).await?;
        let reporting = drain(b.clone(), jobs, true).await?;
        let again = drain(b, jobs, false).await?;
        let base = (silent + again) / 2.0;
        let row = Row {
            scenario: format!(
                "drain of {jobs} 1 s jobs, {SLOTS} slots, 10 progress reports/s each: time vs silent"
            ),
            target: t.label().to_owned(),
            value: reporting / base,
            unit: "x",
            note: format!("silent {silent:.2} s and {again:.2} s, reporting {reporting:.2} s"),
        };
        crate::print(std::slice::from_ref(&row));
        rows.push(row);
    }
    Ok(rows)
}

/// Seconds to drain `n` jobs, reporting progress at each step or not.
async fn drain(b: Arc<dyn Backend>, n: usize, report: bool) -> anyhow::Result<f64> {
    let q = crate::scenarios::queue("progress");
    let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new(&q, Vec::new())).collect();
    for chunk in jobs.chunks(1_000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let start = Instant::now();
    let worker = Worker::builder(b.clone(), [q.clone()])
        .concurrency(SLOTS)
        .no_maintenance()
        .no_schedules()
        .handler(move |_job: ClaimedJob| async move {
            let ctx = JobContext::current().expect("in a handler");
            for step in 0..STEPS {
                if report {
                    ctx.progress(step * 10, format!("step {step} of {STEPS}"))?;
                }
                tokio::time::sleep(STEP).await;
            }
            Ok::<_, JobError>(())
        })
        .build()?
        .spawn();
    relayq::wait_drained(&*b, &q, true, Duration::from_secs(600)).await?;
    let took = start.elapsed().as_secs_f64();
    worker.shutdown().await?;
    Ok(took)
}
