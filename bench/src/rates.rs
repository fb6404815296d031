//! Queue rates (SPEC K8, K9): a drain of jobs with no rate, with a rate far above the
//! drain's (1,000,000 a second: what a rate that never binds costs), and with a rate
//! below it (2,000 a second: the starts per second it gives). 16 worker slots with
//! the drain rows' prefetch. Each job's start is its claim on the server's clock (its
//! lease's expiry less the lease); the run fails if any second of them holds more
//! starts than the rate.
//!
//! Key rates (SPEC K12): the same drain of jobs keyed over 10,000 keys with no key
//! rate and with a default key rate far above what a key gets (1,000 a second each:
//! what judging every key's rate costs), and over 20 keys under 100 a second each
//! (2,000 a second in all: the starts per second it gives). The run fails if any key
//! starts more than its count in a second.

use std::{
    collections::HashMap,
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
                if count.is_some() && !b.limits().rates {
                    return Ok(crate::scenarios::NOT_KEPT);
                }
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

/// A claimed job's payload (its key) and its claim time.
type KeyClaim = (Vec<u8>, DateTime<Utc>);

/// How a key-rate row keys its jobs and rates its keys.
#[derive(Clone, Copy)]
struct Keyed {
    keys: usize,
    rate: Option<u32>,
}

pub async fn key_rates(
    targets: &[Target],
    n: usize,
    paced: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (keyed, jobs) in [
        (
            Keyed {
                keys: 10_000,
                rate: None,
            },
            n,
        ),
        (
            Keyed {
                keys: 10_000,
                rate: Some(1_000),
            },
            n,
        ),
        (
            Keyed {
                keys: 20,
                rate: Some(100),
            },
            paced,
        ),
    ] {
        let name = match keyed.rate {
            None => format!(
                "key rates: drain over {} keys without a key rate, concurrency 16, prefetch {prefetch}",
                keyed.keys
            ),
            Some(c) => format!(
                "key rates: drain over {} keys under a rate of {c}/1s each (burst {}), concurrency 16, prefetch {prefetch}",
                keyed.keys,
                Rate::default_burst(c)
            ),
        };
        rows.extend(
            crate::scenarios::each(targets, runs, &name, None, false, |b, scale| async move {
                if !(b.limits().limit_keys && b.limits().rates) {
                    return Ok(crate::scenarios::NOT_KEPT);
                }
                let jobs = if keyed.keys == 20 {
                    jobs
                } else {
                    (jobs / scale).max(1000)
                };
                keyed_once(b, jobs, keyed, prefetch).await
            })
            .await?,
        );
    }
    Ok(rows)
}

async fn keyed_once(
    b: Arc<dyn Backend>,
    n: usize,
    keyed: Keyed,
    prefetch: u32,
) -> anyhow::Result<f64> {
    let q = queue("krates");
    let limit = keyed.rate.map(|c| Rate::new(c, Duration::from_secs(1)));
    if limit.is_some() {
        b.set_key_rate(&q, None, limit).await?;
    }
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            let key = format!("k{}", i % keyed.keys);
            NewJob::new(&q, key.clone().into_bytes()).limit_key(key)
        })
        .collect();
    for chunk in jobs.chunks(1000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let claims: Arc<Mutex<Vec<KeyClaim>>> = Arc::default();
    let c = claims.clone();
    let lease = TimeDelta::from_std(LEASE)?;
    let see = move |job: &ClaimedJob| {
        let at = job.lease.expires_at - lease;
        c.lock().expect("claims").push((job.payload.clone(), at));
    };
    let r =
        crate::scenarios::run_worker_seeing(b.clone(), &q, n, 16, Some(prefetch), Some(LEASE), see)
            .await?;
    crate::scenarios::clean(&*b, &q).await?;
    if let Some(rate) = limit {
        let mut by_key: HashMap<Vec<u8>, Vec<DateTime<Utc>>> = HashMap::new();
        for (k, t) in std::mem::take(&mut *claims.lock().expect("claims")) {
            by_key.entry(k).or_default().push(t);
        }
        for claims in by_key.values_mut() {
            let worst = most_in_a_second(claims);
            anyhow::ensure!(
                worst <= rate.count as usize,
                "{worst} jobs of one key started within a second under a rate of {rate}"
            );
        }
        b.set_key_rate(&q, None, None).await?;
    }
    Ok(r)
}

/// The most of `claims` (sorted here) in any second.
fn most_in_a_second(claims: &mut [DateTime<Utc>]) -> usize {
    claims.sort_unstable();
    let second = TimeDelta::seconds(1);
    (0..claims.len())
        .map(|i| {
            claims[i..]
                .iter()
                .take_while(|t| **t < claims[i] + second)
                .count()
        })
        .max()
        .unwrap_or(0)
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
    let r =
        crate::scenarios::run_worker_seeing(b.clone(), &q, n, 16, Some(prefetch), Some(LEASE), see)
            .await?;
    crate::scenarios::clean(&*b, &q).await?;
    if let Some(rate) = limit {
        let mut claims = std::mem::take(&mut *claims.lock().expect("claims"));
        let worst = most_in_a_second(&mut claims);
        anyhow::ensure!(
            worst <= rate.count as usize,
            "{worst} jobs started within a second under a rate of {rate}"
        );
        b.update_queue(&q, QueueUpdate::default().rate(None))
            .await?;
    }
    Ok(r)
}
