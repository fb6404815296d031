//! Scenario 4: one batch of 20 stages x 50 no-op jobs, 16 worker slots: total time, and
//! the stage-transition latency (last end of stage k to first start of stage k+1).
//! Then one batch whose single stage holds many jobs, drained like the headline drain:
//! what a batch's bookkeeping costs every settle.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use relayq::{
    ClaimedJob, NewJob, OnFailure, OrderBarrierExt, WaitFor,
    worker::{JobError, Worker},
};

use crate::{
    Row, median,
    scenarios::{clean, job, queue, rate, run_worker},
    targets::Target,
};

const STAGES: i32 = 20;
const PER_STAGE: usize = 50;

/// Per stage: (first start, last end).
type Spans = BTreeMap<i32, (Instant, Instant)>;

pub async fn stages(targets: &[Target], runs: usize) -> anyhow::Result<Vec<Row>> {
    let mut samples: Vec<[Vec<f64>; 3]> = targets.iter().map(|_| Default::default()).collect();
    for _ in 0..runs {
        for (i, t) in targets.iter().enumerate() {
            let [total, p50, p99] = once(t).await?;
            samples[i][0].push(total);
            samples[i][1].push(p50);
            samples[i][2].push(p99);
        }
    }
    let mut rows = Vec::new();
    for (t, [total, p50, p99]) in targets.iter().zip(samples) {
        for (what, s) in [
            ("total", total),
            ("transition p50", p50),
            ("transition p99", p99),
        ] {
            rows.push(Row {
                scenario: format!("stages 20x50, {what}"),
                target: t.label().to_owned(),
                value: median(s),
                unit: "ms",
                note: String::new(),
            });
        }
    }
    Ok(rows)
}

/// `n` no-op jobs in one stage of one batch: enqueued in batches of 1,000 (jobs/s;
/// each call adds to a stage that is already released, so its cost must not grow with
/// the stage), then drained by a worker of 16 slots and `prefetch` (jobs/s; every
/// settle finishes jobs of the batch, which may release its next stage, so the backend
/// looks at the batch on each one).
pub async fn big_stage(
    targets: &[Target],
    n: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut samples: Vec<[Vec<f64>; 2]> = targets.iter().map(|_| Default::default()).collect();
    for _ in 0..runs {
        for (i, t) in targets.iter().enumerate() {
            let b = t.open().await?;
            let n = (n / t.scale()).max(1000).div_ceil(1000) * 1000;
            let q = queue("bigstage");
            let batch = b.open_batch(&q, OnFailure::Continue).await?;
            let start = Instant::now();
            for _ in 0..n / 1000 {
                let jobs = (0..1000).map(|_| job(&q).in_batch(batch.id, 100));
                b.enqueue(jobs.collect()).await?;
            }
            samples[i][0].push(rate(n, start.elapsed()));
            b.seal(&batch).await?;
            samples[i][1].push(run_worker(b.clone(), &q, n, 16, prefetch).await?);
            clean(&*b, &q).await?;
        }
    }
    let names = [
        "enqueue into one batch stage, batches of 1000".to_owned(),
        format!("drain, one batch stage, concurrency 16, prefetch {prefetch}"),
    ];
    let mut rows = Vec::new();
    for (name, k) in names.iter().zip(0..) {
        for (t, s) in targets.iter().zip(&samples) {
            rows.push(Row {
                scenario: name.clone(),
                target: t.label().to_owned(),
                value: median(s[k].clone()),
                unit: "jobs/s",
                note: String::new(),
            });
        }
    }
    Ok(rows)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn once(t: &Target) -> anyhow::Result<[f64; 3]> {
    let b = t.open().await?;
    let q = queue("stages");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let jobs = (0..STAGES)
        .flat_map(|s| (0..PER_STAGE).map(move |_| (s + 1) * 100))
        .map(|stage| NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage))
        .collect();
    b.enqueue(jobs).await?;
    b.seal(&batch).await?;
    let spans = Arc::new(Mutex::new(Spans::new()));
    let s = spans.clone();
    let start = Instant::now();
    let worker = Worker::builder(b.clone(), [q.clone()])
        .concurrency(16)
        .handler(move |job: ClaimedJob| {
            let s = s.clone();
            async move {
                let stage = job.stage.unwrap_or_default();
                let began = Instant::now();
                s.lock()
                    .expect("spans")
                    .entry(stage)
                    .and_modify(|e| e.0 = e.0.min(began))
                    .or_insert((began, began));
                // The end is when the handler returns; the settle follows in the
                // worker's batched acknowledgement, part of the transition.
                s.lock()
                    .expect("spans")
                    .entry(stage)
                    .and_modify(|e| e.1 = e.1.max(Instant::now()));
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    let done = b
        .wait(&batch, WaitFor::Batch, Duration::from_secs(120))
        .await?;
    let total = ms(start.elapsed());
    worker.shutdown().await?;
    anyhow::ensure!(!done.failed, "the batch failed");
    crate::scenarios::clean(&*b, &q).await?;
    let spans = spans.lock().expect("spans");
    let spans: Vec<_> = spans.values().collect();
    anyhow::ensure!(spans.len() == STAGES as usize, "not every stage ran");
    let mut gaps: Vec<f64> = spans
        .windows(2)
        .map(|w| ms(w[1].0.saturating_duration_since(w[0].1)))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let p = |q: f64| gaps[((gaps.len() - 1) as f64 * q).round() as usize];
    Ok([total, p(0.5), p(0.99)])
}
