//! Scenario 8: schedules. `n` schedules firing every 5 s, served by four schedulers,
//! each a loop of `run_schedules` as every worker runs it: the delay from each slot to
//! the end of the pass that enqueued it (an upper bound of the delay to its commit),
//! and a check that each slot was enqueued once.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use chrono::Utc;
use relayq::{
    NewJob,
    schedule::{Schedule, Tick},
};

use crate::{Row, phases::percentile, targets::Target};

const SCHEDULERS: usize = 4;
const CRON: &str = "*/5 * * * * *";

pub async fn schedules(targets: &[Target], n: usize, window: Duration) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        let (b, cleanup) = t.open_isolated("schedules").await?;
        let q = crate::scenarios::queue("sched");
        for i in 0..n {
            let s = Schedule::new(&q, format!("s{i:05}"), CRON).job(NewJob::new(&q, b"x".to_vec()));
            b.put_schedule(&s).await?;
        }
        let stop = Instant::now() + window;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..SCHEDULERS {
            let (b, q) = (b.clone(), q.clone());
            tasks.spawn(async move {
                let mut fired = Vec::new();
                let mut passes = 0u64;
                while Instant::now() < stop {
                    let tick: Tick = b.run_schedules(&q).await?;
                    passes += 1;
                    let now = Utc::now();
                    let wait = tick.sleep(Duration::from_secs(1));
                    for (name, slot, _) in tick.fired {
                        let ms = (now - slot).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e3;
                        fired.push((name, slot, ms));
                    }
                    tokio::time::sleep(wait).await;
                }
                anyhow::Ok((fired, passes))
            });
        }
        let mut fired = Vec::new();
        let mut passes = 0;
        while let Some(done) = tasks.join_next().await {
            let (f, p) = done??;
            fired.extend(f);
            passes += p;
        }
        let unique: BTreeSet<_> = fired.iter().map(|(n, s, _)| (n.clone(), *s)).collect();
        let stored = b.queue_stats(&q).await?.total();
        let once = unique.len() == fired.len() && stored == fired.len() as u64;
        let delays: Vec<f64> = fired.iter().map(|f| f.2).collect();
        let note = if once {
            format!("{} slots, each enqueued once; {passes} passes", fired.len())
        } else {
            format!(
                "VIOLATION: {} fires, {} distinct slots, {stored} jobs stored",
                fired.len(),
                unique.len()
            )
        };
        cleanup.run().await?;
        for (what, value) in [
            ("slot to enqueue p50", percentile(delays.clone(), 0.5)),
            ("slot to enqueue p99", percentile(delays, 0.99)),
        ] {
            let row = Row {
                scenario: format!("schedules {n} x every 5 s, {SCHEDULERS} schedulers: {what}"),
                target: t.label().to_owned(),
                value,
                unit: "ms",
                note: note.clone(),
            };
            crate::print(std::slice::from_ref(&row));
            rows.push(row);
        }
    }
    Ok(rows)
}
