//! How fast this machine drains no-op jobs through the worker runtime, and through a
//! bare claim/settle loop. A rough gauge, not the benchmark (that is `bench/`).
//!
//! ```sh
//! RELAYQ_REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --release -p relayq-redis --example redis_drain -- 50000 16 256
//! ```
//!
//! Arguments: jobs (50,000), worker concurrency (16), worker prefetch (0).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use relayq_core::{
    Admin, Backend, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Inspect, JobState, NewJob,
    Settle,
    worker::{JobError, Worker},
};
use relayq_redis::RedisBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(50_000), |a| a.parse())?;
    let concurrency: u32 = args.next().map_or(Ok(16), |a| a.parse())?;
    let prefetch: u32 = args.next().map_or(Ok(0), |a| a.parse())?;
    let url = std::env::var("RELAYQ_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let b = RedisBackend::connect_with_prefix(&url, "relayq-drain").await?;
    let q = format!("drain-{}", std::process::id());

    fill(&b, &q, n).await?;
    let backend: Arc<dyn Backend> = Arc::new(b.clone());
    let start = Instant::now();
    let worker = Worker::builder(backend, [q.clone()])
        .concurrency(concurrency)
        .prefetch(prefetch)
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()?
        .spawn();
    while b.queue_stats(&q).await?.count(JobState::Succeeded) < n as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let worker_rate = rate(n, start);
    worker.shutdown().await?;

    fill(&b, &q, n).await?;
    let start = Instant::now();
    loop {
        let got = b
            .claim(ClaimRequest::new(&q, "loop", 50, Duration::from_secs(30)))
            .await?;
        if got.is_empty() {
            break;
        }
        let settles = got.into_iter().map(|j| Settle::complete(j.lease)).collect();
        b.settle_many(settles).await?;
    }
    let loop_rate = rate(n, start);
    b.maintain(&q, Duration::ZERO).await?;
    let mut out = std::io::stdout().lock();
    std::io::Write::write_fmt(
        &mut out,
        format_args!(
            "{n} no-op jobs: worker (concurrency {concurrency}, prefetch {prefetch}) \
             {worker_rate:.0} jobs/s; \
             claim 50 + settle 50 loop {loop_rate:.0} jobs/s\n"
        ),
    )?;
    Ok(())
}

async fn fill(b: &RedisBackend, q: &str, n: usize) -> relayq_core::Result<()> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        b.enqueue(chunk.iter().map(|_| NewJob::new(q, vec![7; 100])).collect())
            .await?;
    }
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn rate(n: usize, since: Instant) -> f64 {
    n as f64 / since.elapsed().as_secs_f64()
}
