//! Limit keys (SPEC K): a drain of jobs spread over many keys, each key at a limit of
//! 2, against the same jobs with no limit set; 16 worker slots with the drain rows'
//! prefetch. The handler counts each key's running jobs and the run fails if one ever
//! went above its limit.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use relayq::{
    Backend, ClaimedJob, NewJob,
    worker::{JobError, Worker},
};
use tokio::sync::Notify;

use crate::{
    Row,
    scenarios::{queue, rate},
    targets::Target,
};

/// The limit of every key in the limited row.
const LIMIT: u32 = 2;

pub async fn keys(
    targets: &[Target],
    n: usize,
    keys: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for limited in [false, true] {
        let name = if limited {
            format!(
                "keys: drain over {keys} keys at limit {LIMIT}, concurrency 16, prefetch {prefetch}"
            )
        } else {
            format!(
                "keys: drain over {keys} keys without limits, concurrency 16, prefetch {prefetch}"
            )
        };
        rows.extend(
            crate::scenarios::each(targets, runs, &name, None, false, |b, scale| async move {
                if !b.limits().limit_keys {
                    return Ok(crate::scenarios::NOT_KEPT);
                }
                let n = (n / scale).max(1000);
                once(b, n, (keys / scale).max(100), limited, prefetch).await
            })
            .await?,
        );
    }
    Ok(rows)
}

async fn once(
    b: Arc<dyn Backend>,
    n: usize,
    keys: usize,
    limited: bool,
    prefetch: u32,
) -> anyhow::Result<f64> {
    let q = queue("keys");
    if limited {
        b.set_key_limit(&q, None, Some(LIMIT)).await?;
    }
    // Interleaved, so every claim sees many keys.
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            let key = format!("k{}", i % keys);
            NewJob::new(&q, key.clone().into_bytes()).limit_key(key)
        })
        .collect();
    for chunk in jobs.chunks(1000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let running: Arc<Mutex<HashMap<Vec<u8>, u32>>> = Arc::default();
    let worst = Arc::new(Mutex::new(0u32));
    let done = Arc::new(Mutex::new(0usize));
    let all_done = Arc::new(Notify::new());
    let (r, w, d, a) = (
        running.clone(),
        worst.clone(),
        done.clone(),
        all_done.clone(),
    );
    let start = Instant::now();
    let worker = Worker::builder(b.clone(), [q.clone()])
        .concurrency(16)
        .prefetch(prefetch)
        .handler(move |job: ClaimedJob| {
            let (r, w, d, a) = (r.clone(), w.clone(), d.clone(), a.clone());
            async move {
                {
                    let mut r = r.lock().expect("running");
                    let now = r.entry(job.payload.clone()).or_default();
                    *now += 1;
                    let mut w = w.lock().expect("worst");
                    *w = (*w).max(*now);
                }
                tokio::task::yield_now().await;
                *r.lock()
                    .expect("running")
                    .get_mut(&job.payload)
                    .expect("counted") -= 1;
                let mut d = d.lock().expect("done");
                *d += 1;
                if *d == n {
                    a.notify_one();
                }
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    all_done.notified().await;
    worker.shutdown().await?;
    let r = rate(n, start.elapsed());
    if limited {
        b.set_key_limit(&q, None, None).await?;
    }
    crate::scenarios::clean(&*b, &q).await?;
    let worst = *worst.lock().expect("worst");
    anyhow::ensure!(
        !limited || worst <= LIMIT,
        "{worst} jobs of one key ran at once, limit {LIMIT}"
    );
    Ok(r)
}

/// Jobs of the hot key in [`starvation`].
const HOT: usize = 12_000;
/// Other keys, and jobs of each.
const COLD_KEYS: usize = 100;
const COLD_EACH: usize = 3;

/// SPEC K4 under load: the wait from enqueue to start (p99, ms) of the jobs of 100
/// keys with 3 jobs each, enqueued while a worker runs, with 12,000 jobs of one hot key
/// of limit 1 waiting ahead of them, and without.
pub async fn starvation(
    targets: &[Target],
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for hot in [false, true] {
        let name = if hot {
            format!(
                "keys: wait of 100 keys' jobs behind a hot key of {HOT}, p99, prefetch {prefetch}"
            )
        } else {
            format!("keys: wait of 100 keys' jobs, no hot key, p99, prefetch {prefetch}")
        };
        let mut found =
            crate::scenarios::each(targets, runs, &name, None, false, |b, scale| async move {
                if !b.limits().limit_keys {
                    return Ok(crate::scenarios::NOT_KEPT);
                }
                waits(b, if hot { HOT / scale } else { 0 }, prefetch).await
            })
            .await?;
        for r in &mut found {
            r.unit = "ms";
        }
        rows.extend(found);
    }
    Ok(rows)
}

async fn waits(b: Arc<dyn Backend>, hot: usize, prefetch: u32) -> anyhow::Result<f64> {
    let q = queue("starve");
    b.set_key_limit(&q, None, Some(LIMIT)).await?;
    b.set_key_limit(&q, Some("hot"), Some(1)).await?;
    let hot_jobs: Vec<NewJob> = (0..hot)
        .map(|_| NewJob::new(&q, b"hot".to_vec()).limit_key("hot"))
        .collect();
    for chunk in hot_jobs.chunks(1000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let t0 = Instant::now();
    let waited: Arc<Mutex<Vec<f64>>> = Arc::default();
    let all_done = Arc::new(Notify::new());
    let (w, a) = (waited.clone(), all_done.clone());
    let worker = Worker::builder(b.clone(), [q.clone()])
        .concurrency(16)
        .prefetch(prefetch)
        .handler(move |job: ClaimedJob| {
            let (w, a) = (w.clone(), a.clone());
            async move {
                // Cold jobs carry their enqueue time, in microseconds since t0.
                if let Some(at) = std::str::from_utf8(&job.payload)
                    .ok()
                    .and_then(|p| p.strip_prefix("cold:"))
                    .and_then(|t| t.parse::<u64>().ok())
                {
                    let now = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                    let mut w = w.lock().expect("waited");
                    #[allow(clippy::cast_precision_loss)]
                    w.push(now.saturating_sub(at) as f64 / 1000.0);
                    if w.len() == COLD_KEYS * COLD_EACH {
                        a.notify_one();
                    }
                }
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    // Three waves of a job per key, a tenth of a second apart: the load's shape.
    for _ in 0..COLD_EACH {
        let at = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        let cold: Vec<NewJob> = (0..COLD_KEYS)
            .map(|k| NewJob::new(&q, format!("cold:{at}").into_bytes()).limit_key(format!("c{k}")))
            .collect();
        b.enqueue(cold).await?;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    all_done.notified().await;
    worker.shutdown().await?;
    // The hot key's jobs are still waiting: left behind, every run would add 12,000
    // to the tables the next runs read.
    b.purge(&q).await?;
    b.set_key_limit(&q, None, None).await?;
    b.set_key_limit(&q, Some("hot"), None).await?;
    crate::scenarios::clean(&*b, &q).await?;
    let mut w = waited.lock().expect("waited").clone();
    w.sort_by(f64::total_cmp);
    let p99 = w[(w.len() * 99 / 100).min(w.len() - 1)];
    Ok(p99)
}
