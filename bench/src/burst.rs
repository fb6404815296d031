//! Scenario 7: drain, analyze, burst. A queue of `n` jobs due at once is
//! drained by four claimers (claims of 100, each followed by one settle call of its
//! completions); the tables are then analyzed, as autovacuum's autoanalyze does on its
//! own once a queue has drained; then `n` more jobs are enqueued and drained the same
//! way. Each claim is timed. Before the fix, PostgreSQL planned the second drain for
//! the empty table the statistics described, and its claims took 240 times as long.
//! On the SQL backends only (their planners read statistics); in a namespace of its
//! own, dropped after.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use relayq::{Backend, ClaimRequest, NewJob, Settle, validate};

use crate::{Row, median, scenarios::job, targets::Target};

const CLAIMERS: usize = 4;
const LIMIT: u32 = 100;

pub async fn burst(targets: &[Target], n: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        if !matches!(t, Target::Postgres(_) | Target::Sqlite(_)) {
            continue;
        }
        let (b, cleanup) = t.open_isolated("burst").await?;
        let q = crate::scenarios::queue("burst");
        let first = drain(&b, &q, n).await?;
        cleanup.analyze().await?;
        let burst = drain(&b, &q, n).await?;
        cleanup.run().await?;
        for (phase, d) in [("first drain", &first), ("burst after analyze", &burst)] {
            for (what, value, unit) in [
                ("claim p50", d.p50, "ms"),
                ("claim p99", d.p99, "ms"),
                ("drain", d.seconds * 1000.0, "ms"),
            ] {
                let row = Row {
                    scenario: format!("drain-analyze-burst {n}: {phase}, {what}"),
                    target: t.label().to_owned(),
                    value,
                    unit,
                    note: String::new(),
                };
                crate::print(std::slice::from_ref(&row));
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// One drain's figures.
struct Drained {
    p50: f64,
    p99: f64,
    seconds: f64,
}

/// Enqueues `n` jobs (untimed), then drains them with [`CLAIMERS`] claimers, timing
/// each claim.
async fn drain(b: &Arc<dyn Backend>, q: &str, n: usize) -> anyhow::Result<Drained> {
    let mut left = n;
    while left > 0 {
        let k = left.min(validate::MAX_JOBS_PER_ENQUEUE);
        left -= k;
        b.enqueue((0..k).map(|_| job(q)).collect::<Vec<NewJob>>())
            .await?;
    }
    let start = Instant::now();
    let mut claimers = tokio::task::JoinSet::new();
    for i in 0..CLAIMERS {
        let (b, q) = (b.clone(), q.to_owned());
        claimers.spawn(async move { claim_all(&*b, &q, &format!("burst-{i}")).await });
    }
    let mut took = Vec::new();
    let mut done = 0;
    while let Some(part) = claimers.join_next().await {
        let (times, jobs) = part??;
        took.extend(times);
        done += jobs;
    }
    let seconds = start.elapsed().as_secs_f64();
    anyhow::ensure!(done == n, "drained {done} of {n} jobs");
    let ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    Ok(Drained {
        p50: median(ms.clone()),
        p99: percentile(ms, 0.99),
        seconds,
    })
}

/// Claims and completes until a claim comes back empty; returns each claim's time and
/// the jobs completed.
async fn claim_all(
    b: &dyn Backend,
    q: &str,
    worker: &str,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let mut took = Vec::new();
    let mut done = 0;
    loop {
        let start = Instant::now();
        let got = b
            .claim(ClaimRequest::new(q, worker, LIMIT, Duration::from_secs(60)))
            .await?;
        took.push(start.elapsed());
        if got.is_empty() {
            return Ok((took, done));
        }
        done += got.len();
        let settles = got.into_iter().map(|j| Settle::complete(j.lease)).collect();
        for r in b.settle_many(settles).await? {
            r?;
        }
    }
}

fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let at = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs.get(at).copied().unwrap_or(f64::NAN)
}
