//! Scenario 8: schedules. `n` schedules firing every 5 s, served by four schedulers,
//! each a loop of `run_schedules` as every worker runs it: the delay from each slot to
//! the end of the pass that enqueued it (an upper bound of the delay to its commit),
//! and a check that each slot was enqueued once. Then the cost of an idle worker's
//! scheduler ([`idle`]).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use chrono::Utc;
use relayq::{
    ClaimedJob, NewJob,
    schedule::{Schedule, Tick},
    worker::{JobError, Worker},
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

/// The cost of an idle worker's scheduler: one `Worker` on a queue holding `n`
/// schedules, none due (yearly), measured for a window with its scheduler on and one
/// with it off (`no_schedules`): the bench process's CPU and the server processes' CPU
/// (every `postgres` or `redis-server` process of this machine, read from /proc), as a
/// share of one core.
pub async fn idle(targets: &[Target], n: usize, window: Duration) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        let server = match t {
            Target::Postgres(_) => Some("postgres"),
            Target::Redis(_) | Target::RedisCluster(_) => Some("redis-server"),
            _ => None,
        };
        let (b, cleanup) = t.open_isolated("schedidle").await?;
        let q = crate::scenarios::queue("idle");
        for i in 0..n {
            let s = Schedule::new(&q, format!("s{i:05}"), "0 0 1 1 *")
                .job(NewJob::new(&q, b"x".to_vec()));
            b.put_schedule(&s).await?;
        }
        for on in [true, false] {
            let builder = Worker::builder(b.clone(), [q.clone()])
                .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) });
            let builder = if on { builder } else { builder.no_schedules() };
            let worker = builder.build()?.spawn();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (me0, srv0, at0) = (ticks_of_self(), server.map(ticks_of), Instant::now());
            tokio::time::sleep(window).await;
            let secs = at0.elapsed().as_secs_f64();
            let (me1, srv1) = (ticks_of_self(), server.map(ticks_of));
            worker.shutdown().await?;
            let share = |d: u64| d as f64 / TICKS_PER_SEC / secs * 100.0;
            let state = if on { "scheduler on" } else { "scheduler off" };
            let mut found = vec![(format!("worker CPU, {state}"), share(me1 - me0))];
            if let (Some(a), Some(b)) = (srv0, srv1) {
                found.push((format!("server CPU, {state}"), share(b.saturating_sub(a))));
            }
            for (what, value) in found {
                let row = Row {
                    scenario: format!("idle worker, {n} schedules (none due): {what}"),
                    target: t.label().to_owned(),
                    value,
                    unit: "% of a core",
                    note: String::new(),
                };
                crate::print(std::slice::from_ref(&row));
                rows.push(row);
            }
        }
        cleanup.run().await?;
    }
    Ok(rows)
}

/// Clock ticks per second of /proc's CPU times (`getconf CLK_TCK`: 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// User and system CPU ticks of this process.
fn ticks_of_self() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .map(|s| ticks(&s))
        .unwrap_or(0)
}

/// User and system CPU ticks of every process named `name`.
fn ticks_of(name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|s| {
            s.split_once(" (")
                .is_some_and(|(_, r)| r.starts_with(&format!("{name})")))
        })
        .map(|s| ticks(&s))
        .sum()
}

/// Fields 14 and 15 (utime, stime) of a /proc stat line; the name in parentheses may
/// hold spaces, so fields are counted after its closing parenthesis.
fn ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0;
    };
    let f: Vec<&str> = rest.split(' ').collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}
