//! Scenario 3: enqueue-to-start latency. Idle workers (concurrency 16); a producer on
//! a separate handle (the wake-up crosses the backend's notification path: LISTEN/NOTIFY
//! on PostgreSQL, pub/sub on Redis, the process-wide event bus on SQLite) enqueues at a
//! steady 500 jobs/s; each payload carries its enqueue time, and the handler records
//! start minus enqueue in an HDR histogram.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use hdrhistogram::Histogram;
use relayq::{
    ClaimedJob, EnqueueExt, NewJob,
    worker::{JobError, Worker},
};

use crate::{Row, median, peers::Peers, scenarios::queue, targets::Target};

const RATE: u64 = 500;

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// p50, p99, max in ms, medians over `runs` interleaved runs per target.
pub async fn latency(
    targets: &[Target],
    peers: &Peers,
    n: usize,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let theirs = peers.running("latency");
    let mut samples: Vec<[Vec<f64>; 3]> = (0..targets.len() + theirs.len())
        .map(|_| Default::default())
        .collect();
    let mut notes = vec![String::new(); targets.len() + theirs.len()];
    let mut failed = vec![0; notes.len()];
    for _ in 0..runs {
        for (i, t) in targets.iter().enumerate() {
            let [p50, p99, max] = once(t, n).await?;
            samples[i][0].push(p50);
            samples[i][1].push(p99);
            samples[i][2].push(max);
        }
        for (j, p) in theirs.iter().enumerate() {
            let i = targets.len() + j;
            let m = match peers.run(p, "latency", n, 16).await {
                Ok(m) => m,
                Err(e) => {
                    crate::say(&format!("{p} latency: a run failed: {e}"));
                    failed[i] += 1;
                    continue;
                }
            };
            samples[i][0].push(m.value);
            samples[i][1].push(m.p99.unwrap_or(f64::NAN));
            samples[i][2].push(m.max.unwrap_or(f64::NAN));
            notes[i] = m.settings;
        }
    }
    let labels = targets
        .iter()
        .map(|t| t.label().to_owned())
        .chain(theirs.iter().map(|p| (*p).to_owned()));
    let mut rows = Vec::new();
    for (((label, [p50, p99, max]), mut note), failed) in labels.zip(samples).zip(notes).zip(failed)
    {
        if p50.is_empty() {
            continue;
        }
        if failed > 0 {
            note.push_str(&format!(
                "; {failed} of {runs} runs failed, the figures are the others'"
            ));
        }
        for (what, s) in [("p50", p50), ("p99", p99), ("max", max)] {
            rows.push(Row {
                scenario: format!("latency {RATE}/s, enqueue->start {what}"),
                target: label.clone(),
                value: median(s),
                unit: "ms",
                note: note.clone(),
            });
        }
    }
    Ok(rows)
}

#[allow(clippy::cast_precision_loss)]
async fn once(t: &Target, n: usize) -> anyhow::Result<[f64; 3]> {
    let (producer, consumer) = t.open_pair().await?;
    let q = queue("lat");
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_max(60_000_000, 3)?));
    let h = hist.clone();
    let worker = Worker::builder(consumer.clone(), [q.clone()])
        .concurrency(16)
        .handler(move |job: ClaimedJob| {
            let h = h.clone();
            async move {
                let sent: i64 = std::str::from_utf8(&job.payload)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default();
                let waited = u64::try_from(now_us() - sent).unwrap_or(0);
                h.lock()
                    .expect("histogram")
                    .saturating_record(waited.max(1));
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    // Let the worker go idle (its first empty claims and its poll backoff) first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..n {
        tick.tick().await;
        producer
            .enqueue_one(NewJob::new(&q, now_us().to_string().into_bytes()))
            .await?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while hist.lock().expect("histogram").len() < n as u64 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "jobs did not all start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown().await?;
    crate::scenarios::clean(&*producer, &q).await?;
    let h = hist.lock().expect("histogram");
    let ms = |us: u64| us as f64 / 1000.0;
    Ok([
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    ])
}
