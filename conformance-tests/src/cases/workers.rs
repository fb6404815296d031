//! SPEC M9 — who serves a queue: each worker's last beat.

use std::sync::Arc;

use anyhow::{Context, ensure};
use chrono::Utc;
use relayq_core::{
    ClaimedJob, NewJob, WorkerBeat,
    worker::{JobError, Worker},
};
use tokio::sync::{Notify, mpsc};

use super::support::{PATIENCE, enqueue, expect_invalid};
use crate::{Env, poll_until, queue_name};

fn beat(worker: &str, q: &str, busy: u32) -> WorkerBeat {
    WorkerBeat {
        worker: worker.into(),
        host: "host-1".into(),
        pid: 42,
        queues: vec![q.to_owned()],
        slots: 4,
        busy,
        held: 2,
        started_at: Utc::now(),
    }
}

/// SPEC M9, M4: `workers` lists each worker that beat for the queue once, with its
/// last beat, the most recent first, stamped with the server's time; a beat for
/// another queue is not listed; a bad beat names its field and stores nothing; beats
/// alone do not put a queue in use.
pub async fn m9_workers_lists_each_worker_s_last_beat(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m9");
    let other = queue_name("m9other");
    b.worker_beat(&q, &beat("w1", &q, 1)).await?;
    b.worker_beat(&q, &beat("w2", &q, 0)).await?;
    b.worker_beat(&other, &beat("w3", &other, 0)).await?;
    b.worker_beat(&q, &beat("w1", &q, 3)).await?;
    let seen = b.workers(&q).await?;
    let names: Vec<&str> = seen.iter().map(|w| w.beat.worker.as_str()).collect();
    ensure!(
        names == ["w1", "w2"],
        "listed {names:?}, expected w1 (beat last), w2"
    );
    ensure!(
        seen[0].beat.busy == 3,
        "w1 should show its last beat: {:?}",
        seen[0].beat
    );
    ensure!(
        (
            seen[0].beat.slots,
            seen[0].beat.held,
            seen[0].beat.host.as_str(),
            seen[0].beat.pid
        ) == (4, 2, "host-1", 42),
        "the beat's fields came back changed: {:?}",
        seen[0].beat
    );
    ensure!(
        seen[0].last_seen >= seen[1].last_seen,
        "the most recent first: {seen:?}"
    );
    for w in &seen {
        let off = (Utc::now() - w.last_seen).num_seconds().abs();
        ensure!(off < 60, "last seen {} is {off} s from now", w.last_seen);
    }
    let mut bad = beat("w4", &q, 0);
    bad.slots = 0;
    expect_invalid(b.worker_beat(&q, &bad).await, "slots", "a beat of no slots")?;
    expect_invalid(
        b.worker_beat(&q, &beat("", &q, 0)).await,
        "worker",
        "a beat of no name",
    )?;
    ensure!(b.workers(&q).await?.len() == 2, "a refused beat was stored");
    ensure!(
        b.workers(&queue_name("m9none")).await?.is_empty(),
        "an unserved queue lists workers"
    );
    ensure!(
        !b.queues().await?.contains(&other),
        "a queue with only beats is listed in use"
    );
    Ok(())
}

/// SPEC M9: a running worker beats for its queue at once: its name, its slots, and
/// the slot its handler keeps busy.
pub async fn m9_a_running_worker_beats(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m9run");
    enqueue(b, NewJob::new(&q, b"hold".to_vec())).await?;
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let go = Arc::new(Notify::new());
    let name = format!("beater-{}", uuid::Uuid::new_v4().simple());
    let worker = {
        let go = go.clone();
        Worker::builder(env.connect().await?, [q.clone()])
            .name(name.clone())
            .concurrency(3)
            .no_maintenance()
            .handler(move |_job: ClaimedJob| {
                let (go, started_tx) = (go.clone(), started_tx.clone());
                async move {
                    let _ = started_tx.send(());
                    go.notified().await;
                    Ok::<_, JobError>(())
                }
            })
            .build()?
            .spawn()
    };
    started
        .recv()
        .await
        .context("the worker ended before the job started")?;
    // The first beat may predate the job's start; a later one shows it busy.
    let seen = poll_until("a beat showing the busy slot", PATIENCE * 2, || async {
        let seen = b.workers(&q).await?;
        Ok(seen
            .into_iter()
            .find(|w| w.beat.worker == name && w.beat.busy == 1))
    })
    .await?;
    ensure!(
        seen.beat.slots == 3
            && seen.beat.queues == [q.clone()]
            && seen.beat.pid == std::process::id(),
        "the beat says {:?}",
        seen.beat
    );
    go.notify_waiters();
    worker.shutdown().await?;
    Ok(())
}
