//! The big concurrent scenarios: many claimers, each on its own handle, running claim
//! loops (see [`drain`]) against one queue.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::ensure;
use relayq_core::{JobState, NewJob, OnFailure, OrderBarrierExt, WaitFor};

use super::support::{Load, Span, drain, each_ran_once, enqueue_all, enqueue_n};
use crate::{Env, queue_name};

/// SPEC C2: 8 claimers on 8 handles drain 5,000 jobs; each job is claimed exactly
/// once and none is lost.
pub async fn c2_concurrent_claimers_take_each_job_once(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c2");
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.extend(enqueue_n(b, &q, 1000).await?);
    }
    let run = drain(
        env,
        &q,
        Load {
            workers: 8,
            limit: 16,
            work_ms: (0, 0),
        },
    )
    .await?;
    each_ran_once(&run.spans, &ids)?;
    ensure!(
        run.spans.iter().all(|s| s.attempt == 1),
        "some job was claimed as a second attempt"
    );
    let stats = b.queue_stats(&q).await?;
    ensure!(
        stats.count(JobState::Succeeded) == 5000 && stats.total() == 5000,
        "after the drain: {stats:?}"
    );
    Ok(())
}

/// SPEC B2: one batch with stages 100×4, 200×2, 300×1, 400×2, 500×1, run by 5 workers
/// whose jobs take 50–200 ms: every job of a stage starts after every job of all
/// earlier stages ended, and the 4 jobs of stage 100 run in parallel.
pub async fn b2_staged_batch_runs_stage_by_stage(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("b2load");
    let batch = b.open_batch(&q, OnFailure::Halt).await?;
    let plan = [(100, 4), (200, 2), (300, 1), (400, 2), (500, 1)];
    let jobs = plan
        .iter()
        .flat_map(|&(stage, n)| (0..n).map(move |_| stage))
        .map(|stage| NewJob::new(&q, stage.to_string().into_bytes()).in_batch(batch.id, stage))
        .collect();
    let ids = enqueue_all(b, jobs).await?;
    b.seal(&batch).await?;
    let run = drain(
        env,
        &q,
        Load {
            workers: 5,
            limit: 1,
            work_ms: (50, 200),
        },
    )
    .await?;
    each_ran_once(&run.spans, &ids)?;
    for later in &run.spans {
        for earlier in run.spans.iter().filter(|s| s.stage < later.stage) {
            ensure!(
                later.start >= earlier.end,
                "job {} of stage {:?} started before job {} of stage {:?} ended",
                later.id,
                later.stage,
                earlier.id,
                earlier.stage
            );
        }
    }
    let first: Vec<&Span> = run.spans.iter().filter(|s| s.stage == Some(100)).collect();
    let last_start = first.iter().map(|s| s.start).max();
    let first_end = first.iter().map(|s| s.end).min();
    ensure!(
        first.len() == 4 && last_start < first_end,
        "the 4 jobs of stage 100 did not all run at the same time"
    );
    let p = b
        .wait(&batch, WaitFor::Batch, Duration::from_secs(10))
        .await?;
    for (stage, n) in plan {
        let s = p.stages.iter().find(|s| s.stage == stage);
        ensure!(
            s.is_some_and(|s| s.succeeded == n && s.total() == n),
            "stage {stage}: expected {n} succeeded, progress {s:?}"
        );
    }
    ensure!(p.is_finished() && !p.failed, "batch after the run: {p:?}");
    Ok(())
}

/// SPEC G1, G2: 20 groups × 25 jobs run by 8 workers: no two jobs of a group ever
/// overlap, and each group's jobs start in order-key order.
pub async fn g1_groups_exclusive_and_ordered_under_load(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("g1load");
    let mut jobs = Vec::new();
    for i in 0..25 {
        for g in 0..20 {
            let priority = if i % 7 == 3 { -1 } else { 0 };
            jobs.push(
                NewJob::new(&q, format!("{g}/{i}").into_bytes())
                    .group(format!("g{g}"))
                    .priority(priority),
            );
        }
    }
    let ids = enqueue_all(b, jobs).await?;
    let run = drain(
        env,
        &q,
        Load {
            workers: 8,
            limit: 2,
            work_ms: (0, 3),
        },
    )
    .await?;
    each_ran_once(&run.spans, &ids)?;
    let mut groups: HashMap<&str, Vec<&Span>> = HashMap::new();
    for s in &run.spans {
        groups
            .entry(s.group.as_deref().unwrap_or(""))
            .or_default()
            .push(s);
    }
    ensure!(
        groups.len() == 20,
        "expected 20 groups, saw {}",
        groups.len()
    );
    for (group, mut spans) in groups {
        spans.sort_by_key(|s| s.start);
        for pair in spans.windows(2) {
            ensure!(
                pair[1].start >= pair[0].end,
                "group {group}: job {} started while job {} ran",
                pair[1].id,
                pair[0].id
            );
            let (a, c) = (
                (pair[0].priority, pair[0].run_at, pair[0].id),
                (pair[1].priority, pair[1].run_at, pair[1].id),
            );
            ensure!(
                a < c,
                "group {group}: job {} (key {c:?}) started after job {} (key {a:?})",
                pair[1].id,
                pair[0].id
            );
        }
    }
    Ok(())
}

/// SPEC C6: with `max_running` 3 and 8 claimers on 8 handles, never more than 3 jobs
/// run at once, by the workers' count and by `running()`.
pub async fn c6_max_running_holds_under_load(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("c6load");
    b.set_max_running(&q, Some(3)).await?;
    let ids = enqueue_n(b, &q, 60).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (handle, q, stop, seen) = (env.connect().await?, q.clone(), stop.clone(), seen.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                seen.fetch_max(handle.running(&q).await?.len(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            anyhow::Ok(())
        })
    };
    let run = drain(
        env,
        &q,
        Load {
            workers: 8,
            limit: 2,
            work_ms: (5, 15),
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    watcher.await??;
    let run = run?;
    each_ran_once(&run.spans, &ids)?;
    let listed = seen.load(Ordering::SeqCst);
    ensure!(
        run.max_in_flight <= 3,
        "workers held {} jobs at once with max_running 3",
        run.max_in_flight
    );
    ensure!(
        listed <= 3,
        "running() listed {listed} jobs with max_running 3"
    );
    ensure!(
        run.max_in_flight == 3,
        "the limit was never reached ({}), so the case proved nothing",
        run.max_in_flight
    );
    let per_state: BTreeMap<_, _> = b.queue_stats(&q).await?.counts;
    ensure!(
        per_state.get(&JobState::Succeeded) == Some(&60),
        "after the run: {per_state:?}"
    );
    Ok(())
}
