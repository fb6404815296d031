//! Scenario 6: claim latency with 1,000 / 100,000 / 1,000,000 pending jobs. Each size
//! gets a namespace of its own (schema, key prefix, database file), dropped after.
//! Three rounds of 100 claims of 5 (each followed by an untimed completion and as many
//! new jobs, so the backlog stays put) on the same backlog; the median of the rounds'
//! p50 and p99 is reported. Redis Cluster is left out: a queue lives in one hash slot,
//! so its claim is the standalone script. At the largest size, the dashboard's routes
//! are timed on the same backlog too (`dashboard.rs`).

use std::time::{Duration, Instant};

use relayq::{ClaimRequest, NewJob, Settle, validate};

use crate::{Row, median, scenarios::job, targets::Target};

const CLAIMS: usize = 100;
const ROUNDS: usize = 3;
/// Enqueue calls in flight while a backlog is built.
const BUILDERS: usize = 4;

pub async fn backlog(targets: &[Target], sizes: &[usize]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &size in sizes {
        for t in targets {
            // The in-memory model scans every open job per claim: at its largest size
            // (100,000) one size took ~15 s of `--all` and says nothing new.
            let largest = Some(&size) == sizes.last();
            if matches!(t, Target::RedisCluster(_)) || largest && matches!(t, Target::Memory) {
                continue;
            }
            let n = (size / t.scale()).max(1000);
            let ([p50, p99], dashboard) = once(t, n, largest).await?;
            for (what, v) in [("p50", p50), ("p99", p99)] {
                let row = Row {
                    scenario: format!("claim 5 with {n} pending, {what}"),
                    target: t.label().to_owned(),
                    value: v,
                    unit: "ms",
                    note: String::new(),
                };
                crate::print(std::slice::from_ref(&row));
                rows.push(row);
            }
            rows.extend(dashboard);
        }
    }
    Ok(rows)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The claim p50 and p99 over a backlog of `n`, and, with `dashboard`, the dashboard's
/// rows on it.
async fn once(t: &Target, n: usize, dashboard: bool) -> anyhow::Result<([f64; 2], Vec<Row>)> {
    let (b, cleanup) = t.open_isolated(&format!("backlog{n}")).await?;
    let q = crate::scenarios::queue("backlog");
    // Built untimed in the largest calls enqueue takes, a few at a time: at 1,000 per
    // call one after another, the three 1M backlogs took a fifth of `--all`.
    let mut building = tokio::task::JoinSet::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(validate::MAX_JOBS_PER_ENQUEUE);
        left -= k;
        if building.len() == BUILDERS {
            building.join_next().await.expect("not empty")??;
        }
        let (b, q) = (b.clone(), q.clone());
        building.spawn(async move {
            b.enqueue((0..k).map(|_| job(&q)).collect::<Vec<NewJob>>())
                .await
                .map(drop)
        });
    }
    while let Some(built) = building.join_next().await {
        built??;
    }
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    for _ in 0..ROUNDS {
        let mut took = Vec::with_capacity(CLAIMS);
        for _ in 0..CLAIMS {
            let start = Instant::now();
            let jobs = b
                .claim(ClaimRequest::new(&q, "bench", 5, Duration::from_secs(60)))
                .await?;
            took.push(ms(start.elapsed()));
            anyhow::ensure!(!jobs.is_empty(), "the backlog ran dry");
            // Untimed: complete them and put as many back, so the backlog stays at n.
            let k = jobs.len();
            b.settle_many(
                jobs.into_iter()
                    .map(|j| Settle::complete(j.lease))
                    .collect(),
            )
            .await?;
            b.enqueue((0..k).map(|_| job(&q)).collect()).await?;
        }
        took.sort_by(f64::total_cmp);
        p50s.push(took[CLAIMS / 2]);
        p99s.push(took[CLAIMS * 99 / 100]);
    }
    let rows = if dashboard {
        crate::dashboard::time_api(b.clone(), &q, n, t.label()).await?
    } else {
        Vec::new()
    };
    drop(b);
    cleanup.run().await?;
    Ok(([median(p50s), median(p99s)], rows))
}
