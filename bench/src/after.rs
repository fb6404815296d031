//! Dependencies (SPEC D): the hand-off from a job's end to the start of the job that
//! runs after it, along a chain; a fan-in of many jobs into one; and the enqueue of a
//! graph against the same jobs without edges. A target that keeps no dependencies
//! gets no rows.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use relayq::{
    Backend, ClaimedJob, NewJob, OnFailure, OrderBarrierExt, WaitFor,
    worker::{JobError, Worker},
};

use crate::{
    Row, median,
    scenarios::{clean, queue, rate},
    targets::Target,
};

/// Jobs of the chain: each runs after the one before it.
const CHAIN: usize = 100;

/// Per job (by its payload's number): handler start and end.
type Spans = BTreeMap<usize, (Instant, Instant)>;

pub async fn after(targets: &[Target], runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    let (fan, graph) = if quick {
        (2_000, 2_000)
    } else {
        (10_000, 10_000)
    };
    let mut samples: BTreeMap<(usize, &'static str), Vec<f64>> = BTreeMap::new();
    for _ in 0..runs {
        for (i, t) in targets.iter().enumerate() {
            let b = t.open().await?;
            if !b.limits().dependencies {
                continue;
            }
            let (p50, p99) = chain(&b).await?;
            samples.entry((i, "chain p50")).or_default().push(p50);
            samples.entry((i, "chain p99")).or_default().push(p99);
            let (drain, handoff) = fan_in(&b, fan / t.scale()).await?;
            samples.entry((i, "fan-in drain")).or_default().push(drain);
            samples
                .entry((i, "fan-in hand-off"))
                .or_default()
                .push(handoff);
            let (edges, plain) = enqueue_graph(&b, graph / t.scale()).await?;
            samples.entry((i, "graph enqueue")).or_default().push(edges);
            samples.entry((i, "plain enqueue")).or_default().push(plain);
            samples
                .entry((i, "graph ratio"))
                .or_default()
                .push(edges / plain);
        }
    }
    let name = |what: &str| -> (String, &'static str) {
        match what {
            "chain p50" => (
                format!("after: hand-off along a chain of {CHAIN}, p50"),
                "ms",
            ),
            "chain p99" => (
                format!("after: hand-off along a chain of {CHAIN}, p99"),
                "ms",
            ),
            "fan-in drain" => (format!("after: {fan} jobs into one, drain"), "jobs/s"),
            "fan-in hand-off" => (format!("after: {fan} jobs into one, hand-off"), "ms"),
            "graph enqueue" => (format!("after: enqueue of a {graph}-job graph"), "jobs/s"),
            "plain enqueue" => (
                format!("after: the same {graph} jobs without edges"),
                "jobs/s",
            ),
            _ => ("after: graph enqueue ÷ without edges".to_owned(), "x"),
        }
    };
    let mut rows = Vec::new();
    for ((i, what), s) in samples {
        let (scenario, unit) = name(what);
        rows.push(Row {
            scenario,
            target: targets[i].label().to_owned(),
            value: median(s),
            unit,
            note: String::new(),
        });
    }
    Ok(rows)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs the jobs of `q`'s sealed `batch` with 16 slots, recording each handler's span by
/// the number in its payload, until the batch is finished.
async fn run(b: &Arc<dyn Backend>, q: &str, batch: &relayq::Batch) -> anyhow::Result<Spans> {
    let spans = Arc::new(Mutex::new(Spans::new()));
    let s = spans.clone();
    let worker = Worker::builder(b.clone(), [q.to_owned()])
        .concurrency(16)
        .handler(move |job: ClaimedJob| {
            let s = s.clone();
            async move {
                let began = Instant::now();
                let n: usize = String::from_utf8_lossy(&job.payload).parse().unwrap_or(0);
                s.lock().expect("spans").insert(n, (began, Instant::now()));
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    let done = b
        .wait(batch, WaitFor::Batch, Duration::from_secs(300))
        .await?;
    worker.shutdown().await?;
    anyhow::ensure!(
        done.stages.iter().all(|s| s.dead + s.cancelled == 0),
        "a job did not succeed"
    );
    clean(&**b, q).await?;
    let spans = spans.lock().expect("spans").clone();
    Ok(spans)
}

fn numbered(q: &str, batch: &relayq::Batch, n: usize) -> NewJob {
    NewJob::new(q, n.to_string().into_bytes()).in_batch(batch.id, 0)
}

/// A chain of [`CHAIN`] jobs: the time from each job's end to the next one's start.
async fn chain(b: &Arc<dyn Backend>) -> anyhow::Result<(f64, f64)> {
    let q = queue("after-chain");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let jobs = (0..CHAIN)
        .map(|i| {
            let job = numbered(&q, &batch, i);
            if i == 0 { job } else { job.after_call(i - 1) }
        })
        .collect();
    b.enqueue(jobs).await?;
    b.seal(&batch).await?;
    let spans = run(b, &q, &batch).await?;
    anyhow::ensure!(spans.len() == CHAIN, "not every job of the chain ran");
    let mut gaps: Vec<f64> = (1..CHAIN)
        .map(|i| ms(spans[&i].0.saturating_duration_since(spans[&(i - 1)].1)))
        .collect();
    gaps.sort_by(f64::total_cmp);
    Ok((p(&gaps, 0.5), p(&gaps, 0.99)))
}

/// `n` jobs, then one after all of them (named by id, in a second call): the drain's
/// jobs/s, and the time from the last of them ending to the one after them starting.
async fn fan_in(b: &Arc<dyn Backend>, n: usize) -> anyhow::Result<(f64, f64)> {
    let q = queue("after-fan");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let parents = b
        .enqueue((1..=n).map(|i| numbered(&q, &batch, i)).collect())
        .await?;
    let mut sink = numbered(&q, &batch, 0);
    sink.after = parents.iter().map(|e| relayq::After::Job(e.id)).collect();
    b.enqueue(vec![sink]).await?;
    b.seal(&batch).await?;
    let start = Instant::now();
    let spans = run(b, &q, &batch).await?;
    let drain = rate(n + 1, start.elapsed());
    let last = spans
        .range(1..)
        .map(|(_, s)| s.1)
        .max()
        .ok_or_else(|| anyhow::anyhow!("no parent ran"))?;
    Ok((drain, ms(spans[&0].0.saturating_duration_since(last))))
}

/// Enqueues `n` jobs of one batch in one call, as a binary tree (each job after the
/// one at half its place), then the same jobs without edges: jobs/s of each.
async fn enqueue_graph(b: &Arc<dyn Backend>, n: usize) -> anyhow::Result<(f64, f64)> {
    let mut out = [0.0; 2];
    for (k, edges) in [true, false].into_iter().enumerate() {
        let q = queue("after-graph");
        let batch = b.open_batch(&q, OnFailure::Continue).await?;
        let jobs: Vec<NewJob> = (0..n)
            .map(|i| {
                let job = numbered(&q, &batch, i);
                if edges && i > 0 {
                    job.after_call((i - 1) / 2)
                } else {
                    job
                }
            })
            .collect();
        let start = Instant::now();
        b.enqueue(jobs).await?;
        out[k] = rate(n, start.elapsed());
        b.cancel_batch(&batch).await?;
        clean(&**b, &q).await?;
    }
    Ok((out[0], out[1]))
}
