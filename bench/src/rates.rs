//! Queue rates (SPEC K8, K9): a drain of jobs with no rate, with a rate far above the
//! drain's (1,000,000 a second: what a rate that never binds costs), and with a rate
//! below it (2,000 a second: the starts per second it gives). 16 worker slots with
//! the drain rows' prefetch. Each job's start is its claim on the server's clock (its
//! lease's expiry less the lease); the run fails if any second of them holds more
//! starts than the rate.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use relayq::{Backend, ClaimedJob, NewJob, QueueUpdate, Rate};

use crate::{Row, scenarios::queue, targets::Target};

/// The lease the worker takes, to read each claim's time back from its expiry.
const LEASE: Duration = Duration::from_secs(60);

pub async fn rates(
    targets: &[Target],
    n: usize,
    paced: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (count, jobs) in [(None, n), (Some(1_000_000), n), (Some(2_000), paced)] {
        let name = match count {
            None => format!("rates: drain without a rate, concurrency 16, prefetch {prefetch}"),
            Some(c) => format!(
                "rates: drain under a rate of {c}/1s (burst {}), concurrency 16, prefetch {prefetch}",
                Rate::default_burst(c)
            ),
        };
        rows.extend(
            crate::scenarios::each(targets, runs, &name, None, false, |b, scale| async move {
                let jobs = if count == Some(2_000) {
                    jobs
                } else {
                    (jobs / scale).max(1000)
                };
                once(b, jobs, count, prefetch).await
            })
            .await?,
        );
    }
    Ok(rows)
}

async fn once(
    b: Arc<dyn Backend>,
    n: usize,
    count: Option<u32>,
    prefetch: u32,
) -> anyhow::Result<f64> {
    let q = queue("rates");
    let limit = count.map(|c| Rate::new(c, Duration::from_secs(1)));
    if limit.is_some() {
        b.update_queue(&q, QueueUpdate::default().rate(limit))
            .await?;
    }
    let jobs: Vec<NewJob> = (0..n).map(|_| crate::scenarios::job(&q)).collect();
    for chunk in jobs.chunks(1000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let claims: Arc<Mutex<Vec<DateTime<Utc>>>> = Arc::default();
    let c = claims.clone();
    let lease = TimeDelta::from_std(LEASE)?;
    let see = move |job: &ClaimedJob| {
        c.lock().expect("claims").push(job.lease.expires_at - lease);
    };
    let r = crate::scenarios::run_worker_seeing(b.clone(), &q, n, 16, prefetch, Some(LEASE), see)
        .await?;
    crate::scenarios::clean(&*b, &q).await?;
    if let Some(rate) = limit {
        let mut claims = std::mem::take(&mut *claims.lock().expect("claims"));
        claims.sort_unstable();
        let second = TimeDelta::seconds(1);
        let worst = (0..claims.len())
            .map(|i| {
                claims[i..]
                    .iter()
                    .take_while(|t| **t < claims[i] + second)
                    .count()
            })
            .max()
            .unwrap_or(0);
        anyhow::ensure!(
            worst <= rate.count as usize,
            "{worst} jobs started within a second under a rate of {rate}"
        );
        b.update_queue(&q, QueueUpdate::default().rate(None))
            .await?;
    }
    Ok(r)
}
