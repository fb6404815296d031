//! The worker runtime when its backend misbehaves or its timers race (SPEC W1, W2, W3, W4,
//! L6): heartbeats that fail or hang, a settle call refused as a whole, a retry time
//! out of range, a claim that panics, a handler that returns as the shutdown deadline
//! passes, a burst of queued wake-ups; and a backend that prefers its own settle batch.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use relayq_core::{
    memory::MemoryBackend,
    worker::{JobError, Worker},
    *,
};
use support::{
    builder, enqueue_n,
    faulty::{Beats, Faulty},
    queue, state, until,
};
use tokio::sync::{Barrier, Notify};

/// SPEC W1: a lease whose heartbeats never get through (they fail, or hang) stops its
/// handler before the lease runs out: when the job is claimed again (here by the same
/// worker, which has a free slot), the first attempt's handler no longer runs.
#[tokio::test]
async fn w1_a_lease_no_heartbeat_renews_stops_the_handler() {
    /// Counts the handlers running now; drops when the handler stops or is stopped.
    struct Live(Arc<AtomicU32>);
    impl Drop for Live {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    for beats in [Beats::Fail, Beats::Hang] {
        let b = Arc::new(MemoryBackend::new());
        let q = queue();
        let id = enqueue_n(&b, &q, 1, 3).await[0];
        let (live, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (live2, most2) = (live.clone(), most.clone());
        let faulty = Faulty::new(&b, beats);
        let w = Worker::builder(faulty, [q.clone()])
            .concurrency(2)
            .lease(Duration::from_millis(300))
            .handler(move |_job: ClaimedJob| {
                let now = live2.fetch_add(1, Ordering::SeqCst) + 1;
                most2.fetch_max(now, Ordering::SeqCst);
                let guard = Live(live2.clone());
                async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(guard);
                    Ok::<_, JobError>(())
                }
            })
            .build()
            .unwrap()
            .spawn();
        until("job claimed a second time", async || {
            b.job(&q, id).await.unwrap().attempts >= 2
        })
        .await;
        w.shutdown().await.unwrap();
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "a handler ran on beside the next attempt of its job"
        );
    }
}

/// A handler for two jobs: the one with payload `[1]` fails with `error`, the other
/// succeeds once it did. Both return before the worker runs dry, so their outcomes go
/// to the settler in one batch.
fn bad_then_good(error: JobError) -> impl worker::Handler {
    let bad_done = Arc::new(Notify::new());
    move |job: ClaimedJob| {
        let (bad_done, error) = (bad_done.clone(), error.clone());
        async move {
            if job.payload[0] == 1 {
                bad_done.notify_one();
                return Err(error);
            }
            bad_done.notified().await;
            Ok(())
        }
    }
}

/// SPEC W3, L6: a handler that asks for a retry time the backends refuse fails its job
/// on the default backoff, saying why, and the outcome batched beside it is stored.
#[tokio::test]
async fn w3_a_retry_time_out_of_range_fails_only_its_job() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let [good, bad] = enqueue_n(&b, &q, 2, 3).await[..] else {
        unreachable!()
    };
    let w = builder(&b, &q)
        .concurrency(2)
        .settle_delay(Duration::from_secs(1))
        .handler(bad_then_good(
            JobError::retryable("x").retry_after(Duration::MAX),
        ))
        .build()
        .unwrap()
        .spawn();
    until("good job succeeded", async || {
        state(&b, &q, good).await == JobState::Succeeded
    })
    .await;
    until("bad job's attempt closed", async || {
        !b.job(&q, bad).await.unwrap().attempt_log.is_empty()
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.lost, 0);
    assert_eq!(b.job(&q, good).await.unwrap().attempts, 1);
    let info = b.job(&q, bad).await.unwrap();
    let first = &info.attempt_log[0];
    assert_eq!(first.outcome, AttemptOutcome::Failed);
    let error = first.error.as_deref().unwrap();
    assert!(
        error.starts_with("x (retry time refused:"),
        "the error says why the backoff was used: {error}"
    );
    assert_ne!(info.state, JobState::Dead, "attempts were left");
}

/// SPEC L6: a settle call refused as a whole for one outcome (here by a backend that
/// refuses failures named `poison`) is settled again one outcome at a time, so the
/// others are stored and only that one is lost.
#[tokio::test]
async fn w1_a_refused_settle_call_loses_only_the_bad_outcome() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let [good, bad] = enqueue_n(&b, &q, 2, 3).await[..] else {
        unreachable!()
    };
    let faulty = Faulty::new(&b, Beats::Pass);
    let w = Worker::builder(faulty, [q.clone()])
        .concurrency(2)
        .settle_delay(Duration::from_secs(1))
        .handler(bad_then_good(JobError::permanent("poison")))
        .build()
        .unwrap()
        .spawn();
    until("good job succeeded", async || {
        state(&b, &q, good).await == JobState::Succeeded
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!((report.succeeded, report.lost), (1, 1));
    assert_eq!(b.job(&q, good).await.unwrap().attempts, 1);
    assert_eq!(state(&b, &q, bad).await, JobState::Running);
}

/// SPEC X4: the worker calls `settle_many` again after a transient backend error (a
/// lost connection, a deadlock victim), and not after any other: that one would fail
/// again, and the outcome is given up (its lease expires and the job runs again).
#[tokio::test]
async fn w1_settles_are_retried_after_transient_errors_only() {
    for (error, retried) in [
        (Error::transient("connection reset, for the test"), true),
        (Error::backend("permission denied, for the test"), false),
    ] {
        let b = Arc::new(MemoryBackend::new());
        let q = queue();
        let [job] = enqueue_n(&b, &q, 1, 3).await[..] else {
            unreachable!()
        };
        let faulty = Faulty::new(&b, Beats::Pass);
        faulty.settle_errors.lock().unwrap().push(error);
        let w = Worker::builder(faulty.clone(), [q.clone()])
            .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
            .build()
            .unwrap()
            .spawn();
        until("the outcome settled or given up", async || {
            faulty.settle_calls().len() >= if retried { 2 } else { 1 }
        })
        .await;
        let report = w.shutdown().await.unwrap();
        assert_eq!(faulty.settle_calls().len(), if retried { 2 } else { 1 });
        let want = if retried { (1, 0) } else { (0, 1) };
        assert_eq!((report.succeeded, report.lost), want, "retried: {retried}");
        let done = state(&b, &q, job).await == JobState::Succeeded;
        assert_eq!(done, retried);
    }
}

/// SPEC W4: a handler that returns in the same instant as the shutdown deadline passes
/// has done its work: its job completes, and is not released to run again. (Time is
/// paused: the handler starts its last 200 ms once the shutdown's 200 ms began, so both
/// end on one tick, the deadline's timer first.)
#[tokio::test(start_paused = true)]
async fn w4_a_handler_done_at_the_shutdown_deadline_completes() {
    for round in 0..20 {
        let b = Arc::new(MemoryBackend::new());
        let q = queue();
        let id = enqueue_n(&b, &q, 1, 3).await[0];
        let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (started2, go2) = (started.clone(), go.clone());
        let w = builder(&b, &q)
            .shutdown_timeout(Duration::from_millis(200))
            .handler(move |_job: ClaimedJob| {
                let (started, go) = (started2.clone(), go2.clone());
                async move {
                    started.notify_one();
                    go.notified().await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, JobError>(())
                }
            })
            .build()
            .unwrap()
            .spawn();
        started.notified().await;
        let stopping = tokio::spawn(w.shutdown());
        // Long enough for the shutdown to reach its deadline's timer; no time passes.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        go.notify_one();
        let report = stopping.await.unwrap().unwrap();
        assert_eq!((report.succeeded, report.released), (1, 0), "round {round}");
        assert_eq!(state(&b, &q, id).await, JobState::Succeeded);
    }
}

/// SPEC W4: shutdown ends while the server answers no settle: the outcomes it cannot
/// store are counted as lost (their jobs run again once their leases end), and every
/// claimed job is still counted once.
#[tokio::test]
async fn w4_shutdown_ends_while_the_server_does_not_answer() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    enqueue_n(&b, &q, 3, 3).await;
    let faulty = Faulty::new(&b, Beats::Pass);
    faulty.hang_settles.store(true, Ordering::SeqCst);
    let w = Worker::builder(faulty.clone(), [q.clone()])
        .shutdown_timeout(Duration::from_millis(200))
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    until("the worker to try to settle", async || {
        !faulty.settle_calls().is_empty()
    })
    .await;
    let report = tokio::time::timeout(Duration::from_secs(10), w.shutdown())
        .await
        .expect("shutdown waited on a server that does not answer")
        .unwrap();
    assert_eq!(report.ended(), report.claimed, "{report:?}");
    assert!(report.claimed >= 1 && report.lost >= 1, "{report:?}");
    assert_eq!(report.succeeded, 0, "{report:?}");
}

/// SPEC W4: a backend whose claim panics fails that claim, not the worker: its running
/// jobs are still released at shutdown, their attempts not counted.
#[tokio::test]
async fn w4_a_claim_that_panics_leaves_the_worker_running() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 2, 3).await;
    let faulty = Arc::new(Faulty {
        panic_claims: true,
        ..Arc::into_inner(Faulty::new(&b, Beats::Pass)).unwrap()
    });
    let w = Worker::builder(faulty.clone(), [q.clone()])
        .concurrency(3)
        .shutdown_timeout(Duration::from_millis(100))
        .handler(|_job: ClaimedJob| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    // The first claim took both jobs; the next, for the free slot, panics.
    until("a claim panicked", async || {
        faulty.claims.load(Ordering::SeqCst) >= 2
    })
    .await;
    let report = w.shutdown().await.expect("the worker outlived the panic");
    assert_eq!(report.released, 2);
    for id in ids {
        let info = b.job(&q, id).await.unwrap();
        assert_eq!((info.state, info.attempts), (JobState::Ready, 0));
    }
}

/// SPEC W2: wake-ups queued while the worker had no free slot are one wake-up and one
/// claim once it is idle again, not one claim each (a Redis Cluster sends each event
/// once per master, so such bursts are the rule there).
#[tokio::test]
async fn w2_a_burst_of_queued_events_is_one_claim() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let first = enqueue_n(&b, &q, 1, 3).await[0];
    let faulty = Faulty::new(&b, Beats::Pass);
    let (open, gate) = tokio::sync::watch::channel(false);
    let w = Worker::builder(faulty.clone(), [q.clone()])
        .concurrency(1)
        .handler(move |_job: ClaimedJob| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|&open| open).await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    until("first job running", async || {
        state(&b, &q, first).await == JobState::Running
    })
    .await;
    // Its one slot is busy, so it does not listen: 50 wake-ups queue up, for jobs due
    // only in an hour.
    for _ in 0..50 {
        b.enqueue_one(NewJob::new(&q, vec![9]).delay(Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    let before = faulty.claims.load(Ordering::SeqCst);
    open.send_replace(true);
    until("first job done", async || {
        state(&b, &q, first).await == JobState::Succeeded
    })
    .await;
    let last = enqueue_n(&b, &q, 1, 3).await[0];
    until("last job done", async || {
        state(&b, &q, last).await == JobState::Succeeded
    })
    .await;
    let claims = faulty.claims.load(Ordering::SeqCst) - before;
    w.shutdown().await.unwrap();
    assert!(claims < 20, "{claims} claims after 50 queued wake-ups");
}

/// SPEC W1, L6: a worker whose `settle_batch` is not set settles in calls of its
/// backend's preferred size, and one that sets it, in calls of its own size. The
/// handlers wait for each other in waves of 16 (32 jobs, 16 slots: the job count must
/// stay a multiple of 16, or the last wave never completes), so outcomes come 16 at a
/// time, and the settle delay is long: a call is cut by its size, or for the last
/// outcomes by the worker running dry.
#[tokio::test]
async fn w1_settle_calls_take_the_backends_preferred_size_unless_set() {
    for (set, want) in [(None, 3), (Some(5), 5)] {
        let b = Arc::new(MemoryBackend::new());
        let q = queue();
        enqueue_n(&b, &q, 32, 3).await;
        let faulty = Arc::new(Faulty {
            preferred: 3,
            ..Arc::into_inner(Faulty::new(&b, Beats::Pass)).unwrap()
        });
        let wave = Arc::new(Barrier::new(16));
        let mut w = Worker::builder(faulty.clone(), [q.clone()])
            .concurrency(16)
            .settle_delay(Duration::from_secs(1))
            .handler(move |_job: ClaimedJob| {
                let wave = wave.clone();
                async move {
                    wave.wait().await;
                    Ok::<_, JobError>(())
                }
            });
        if let Some(n) = set {
            w = w.settle_batch(n);
        }
        let w = w.build().unwrap().spawn();
        until("every job succeeded", async || {
            b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == 32
        })
        .await;
        w.shutdown().await.unwrap();
        let calls = faulty.settle_calls();
        assert_eq!(calls.iter().sum::<usize>(), 32, "calls {calls:?}");
        assert_eq!(
            calls.iter().max(),
            Some(&want),
            "settle_batch {set:?}: calls {calls:?}"
        );
    }
}

/// SPEC W1, L6: the settle batch a worker takes: 128 from a backend that states no
/// preference, the backend's preference kept within 1..=1000, or the builder's own.
#[test]
fn the_settle_batch_is_the_builders_or_the_backends_within_range() {
    let b = Arc::new(MemoryBackend::new());
    let ok = |_job: ClaimedJob| async { Ok::<_, JobError>(()) };
    let batch = |backend: Arc<dyn Backend>, set: Option<usize>| {
        let mut w = Worker::builder(backend, ["q"]).handler(ok);
        if let Some(n) = set {
            w = w.settle_batch(n);
        }
        w.build().unwrap().settle_batch()
    };
    assert_eq!(batch(b.clone(), None), DEFAULT_SETTLE_BATCH);
    assert_eq!(DEFAULT_SETTLE_BATCH, 128);
    for (preferred, want) in [(0, 1), (512, 512), (5000, 1000)] {
        let faulty = Arc::new(Faulty {
            preferred,
            ..Arc::into_inner(Faulty::new(&b, Beats::Pass)).unwrap()
        });
        assert_eq!(batch(faulty.clone(), None), want, "preferred {preferred}");
        assert_eq!(batch(faulty, Some(7)), 7, "preferred {preferred}, set 7");
    }
}

/// SPEC L7: handlers that report progress a hundred times a second are written at most
/// once a second per job, every running job's report in the same call; what is stored
/// is a report the handler made.
#[tokio::test(start_paused = true)]
async fn l7_progress_is_written_at_most_once_a_second() {
    let b = Arc::new(MemoryBackend::new());
    let f = Faulty::new(&b, Beats::Pass);
    let q = queue();
    let ids = enqueue_n(&b, &q, 3, 1).await;
    let w = Worker::builder(f.clone(), [q.clone()])
        .concurrency(3)
        .handler(|_job: ClaimedJob| async move {
            let ctx = worker::JobContext::current().expect("in a handler");
            for step in 0..300u16 {
                ctx.progress(u8::try_from(step / 3).unwrap(), format!("step {step}"))?;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    for id in &ids {
        until("the job to succeed", async || {
            state(&b, &q, *id).await == JobState::Succeeded
        })
        .await;
    }
    w.shutdown().await.unwrap();
    let calls = f.progress_calls.lock().unwrap().clone();
    assert!(
        (2..=4).contains(&calls.len()),
        "3 s of reports from 3 jobs took {} calls",
        calls.len()
    );
    for pair in calls.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(gap >= Duration::from_secs(1), "two writes {gap:?} apart");
    }
    for id in &ids {
        let written = calls.iter().filter(|(_, r)| r.iter().any(|(j, _)| j == id));
        assert!(written.count() >= 2, "job {id} was written under twice");
        let shown = b.job(&q, *id).await.unwrap().progress.expect("stored");
        let step: u16 = shown.message["step ".len()..].parse().unwrap();
        assert_eq!(step / 3, u16::from(shown.percent), "{shown:?}");
    }
}
