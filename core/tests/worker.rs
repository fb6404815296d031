//! The worker runtime on the memory backend (SPEC W1–W5).

mod support;

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use relayq_core::{
    memory::MemoryBackend,
    worker::{JobError, Worker, WorkerBuilder, WorkerReport},
    *,
};
use support::{builder, enqueue_n, queue, state, stoppable, until};
use tokio::{
    sync::watch,
    time::{Instant, sleep},
};

/// A handler that keeps job `blocker` running until the returned sender says `true`
/// and returns at once for every other job, counting them in the returned counter.
/// While the blocker runs the worker is not dry, so the other jobs' outcomes wait in
/// the settler for company.
fn blocking(blocker: JobId) -> (impl worker::Handler, watch::Sender<bool>, Arc<AtomicU32>) {
    let (open, rx) = watch::channel(false);
    let returned = Arc::new(AtomicU32::new(0));
    let others = returned.clone();
    let handler = move |job: ClaimedJob| {
        let mut rx = rx.clone();
        let others = others.clone();
        let block = job.id() == blocker;
        async move {
            if block {
                let _ = rx.wait_for(|&open| open).await;
            } else {
                others.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, JobError>(())
        }
    };
    (handler, open, returned)
}

/// Runs one single-attempt job through a worker set up by `setup` until the job is
/// dead; returns the error it died with and the worker's report.
async fn dies_with(setup: impl FnOnce(WorkerBuilder) -> WorkerBuilder) -> (String, WorkerReport) {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 1).await[0];
    let w = setup(builder(&b, &q)).build().unwrap().spawn();
    until("job dead", async || {
        state(&b, &q, id).await == JobState::Dead
    })
    .await;
    let report = w.shutdown().await.unwrap();
    let error = b.job(&q, id).await.unwrap().last_error.unwrap();
    (error, report)
}

#[tokio::test]
async fn w1_claims_free_slots_in_one_call_and_settles_in_batches() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 40, 3).await;
    // The memory backend stamps one server time per call, so equal times mean one call:
    // a claim's leases share their expiry.
    let expiries = Arc::new(Mutex::new(HashSet::new()));
    let seen = expiries.clone();
    let w = builder(&b, &q)
        .concurrency(40)
        .settle_delay(Duration::from_millis(20))
        .handler(move |job: ClaimedJob| {
            seen.lock().unwrap().insert(job.lease.expires_at);
            async { Ok::<_, JobError>(()) }
        })
        .build()
        .unwrap()
        .spawn();
    until("all jobs succeeded", async || {
        b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == 40
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.succeeded, 40);
    assert_eq!(report.claimed, 40);
    let starts = expiries.lock().unwrap().clone();
    let mut ends = HashSet::new();
    for id in ids {
        let log = b.job(&q, id).await.unwrap().attempt_log;
        ends.insert(log[0].ended_at.unwrap());
    }
    assert_eq!(
        starts.len(),
        1,
        "40 free slots should be filled by one claim"
    );
    assert!(
        ends.len() < 10,
        "40 outcomes took {} settle calls",
        ends.len()
    );
}

#[tokio::test]
async fn w3_handler_errors_fail_retryable_or_permanent() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let retry = b
        .enqueue_one(NewJob::new(&q, b"retry".to_vec()))
        .await
        .unwrap()
        .id;
    let perm = b
        .enqueue_one(NewJob::new(&q, b"perm".to_vec()))
        .await
        .unwrap()
        .id;
    let w = builder(&b, &q)
        .handler(|job: ClaimedJob| async move {
            match (&job.payload[..], job.attempt()) {
                (b"retry", 1) => {
                    Err(JobError::retryable("flaky").retry_after(Duration::from_millis(50)))
                }
                (b"retry", _) => Ok(()),
                _ => Err(JobError::permanent("bad input")),
            }
        })
        .build()
        .unwrap()
        .spawn();
    until("retried job succeeded", async || {
        state(&b, &q, retry).await == JobState::Succeeded
    })
    .await;
    until("permanent failure dead", async || {
        state(&b, &q, perm).await == JobState::Dead
    })
    .await;
    w.shutdown().await.unwrap();
    let retried = b.job(&q, retry).await.unwrap();
    assert_eq!(retried.attempts, 2);
    assert_eq!(retried.attempt_log[0].outcome, AttemptOutcome::Failed);
    assert_eq!(retried.attempt_log[0].error.as_deref(), Some("flaky"));
    let dead = b.job(&q, perm).await.unwrap();
    assert_eq!(dead.attempts, 1, "a permanent failure is not retried");
    assert_eq!(dead.last_error.as_deref(), Some("bad input"));
}

#[tokio::test]
async fn w3_std_errors_convert_with_question_mark() {
    let (err, _) = dies_with(|w| {
        w.handler(|job: ClaimedJob| async move {
            let _n: u32 = std::str::from_utf8(&job.payload)?.parse()?;
            Ok::<_, JobError>(())
        })
    })
    .await;
    assert!(err.contains("invalid digit"), "{err}");
}

#[tokio::test]
async fn w3_panic_fails_the_job_with_its_message() {
    let (err, report) = dies_with(|w| {
        w.handler(|job: ClaimedJob| async move {
            assert!(job.payload.is_empty(), "boom in handler");
            Ok::<_, JobError>(())
        })
    })
    .await;
    assert_eq!(report.failed, 1);
    assert!(err.contains("boom in handler"), "{err}");
}

#[tokio::test]
async fn w3_handler_past_its_timeout_is_failed() {
    let (err, _) = dies_with(|w| {
        w.timeout(Duration::from_millis(100))
            .handler(|_job: ClaimedJob| async move {
                sleep(Duration::from_secs(60)).await;
                Ok::<_, JobError>(())
            })
    })
    .await;
    assert!(err.contains("timed out"), "{err}");
}

/// A handler that never yields cannot be stopped at its timeout; once it returns, it is
/// failed all the same rather than counted a success.
#[tokio::test]
async fn w3_a_handler_that_blocks_past_its_timeout_is_failed() {
    let (err, report) = dies_with(|w| {
        w.timeout(Duration::from_millis(50))
            .handler(|_job: ClaimedJob| async move {
                // Work that never yields (not a wait for anything).
                std::thread::sleep(Duration::from_millis(200));
                Ok::<_, JobError>(())
            })
    })
    .await;
    assert!(err.contains("timed out"), "{err}");
    assert_eq!((report.succeeded, report.failed), (0, 1));
}

/// A handler's own permanent failure stands even when it is seen past the timeout.
#[tokio::test]
async fn w3_a_permanent_error_seen_past_the_timeout_stays_permanent() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let w = builder(&b, &q)
        .timeout(Duration::from_millis(20))
        .handler(|_job: ClaimedJob| async move {
            std::thread::sleep(Duration::from_millis(100));
            Err::<(), _>(JobError::permanent("bad input"))
        })
        .build()
        .unwrap()
        .spawn();
    until("job dead", async || {
        state(&b, &q, id).await == JobState::Dead
    })
    .await;
    w.shutdown().await.unwrap();
    let info = b.job(&q, id).await.unwrap();
    assert_eq!(info.attempts, 1);
    assert_eq!(info.last_error.as_deref(), Some("bad input"));
}

/// A hand-written handler whose `handle` panics before returning its future.
struct PanicsEarly;

impl worker::Handler for PanicsEarly {
    fn handle<'a, 'b>(
        &'a self,
        _job: ClaimedJob,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<worker::Done, JobError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        panic!("boom before the future")
    }
}

#[tokio::test]
async fn w3_a_panic_before_the_handlers_future_fails_the_job() {
    let (err, report) = dies_with(|w| w.handler(PanicsEarly)).await;
    assert_eq!(report.failed, 1);
    assert!(err.contains("boom before the future"), "{err}");
}

/// Runs one job under a 300 ms lease with `handler`, which takes four leases' worth,
/// trying to take the job over every 50 ms while it runs; fails if that ever works.
/// Returns the job once it succeeded.
async fn run_untaken(handler: impl worker::Handler) -> JobInfo {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let lease = Duration::from_millis(300);
    let w = builder(&b, &q)
        .lease(lease)
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("job running", async || {
        state(&b, &q, id).await == JobState::Running
    })
    .await;
    while state(&b, &q, id).await == JobState::Running {
        let other = b
            .claim(ClaimRequest::new(&q, "thief", 1, lease))
            .await
            .unwrap();
        assert!(other.is_empty(), "job was taken over while heartbeated");
        sleep(Duration::from_millis(50)).await;
    }
    until("job succeeded", async || {
        state(&b, &q, id).await == JobState::Succeeded
    })
    .await;
    w.shutdown().await.unwrap();
    b.job(&q, id).await.unwrap()
}

#[tokio::test]
async fn w1_heartbeat_keeps_a_long_job_alive_past_its_first_lease() {
    let info = run_untaken(|_job: ClaimedJob| async move {
        sleep(Duration::from_millis(1200)).await;
        Ok::<_, JobError>(())
    })
    .await;
    assert_eq!(info.attempts, 1);
    assert_eq!(info.attempt_log.len(), 1);
}

/// A heartbeat interval near the lease (here three quarters of it) still renews the lease
/// in time: the keeper's own deadline for the lease comes after each beat is due.
#[tokio::test]
async fn w1_a_long_heartbeat_interval_keeps_the_lease() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let w = builder(&b, &q)
        .lease(Duration::from_millis(600))
        .heartbeat(Duration::from_millis(450))
        .handler(|_job: ClaimedJob| async move {
            sleep(Duration::from_millis(1000)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    until("job succeeded", async || {
        state(&b, &q, id).await == JobState::Succeeded
    })
    .await;
    w.shutdown().await.unwrap();
    let info = b.job(&q, id).await.unwrap();
    assert_eq!((info.attempts, info.attempt_log.len()), (1, 1));
}

/// Heartbeats come from a task of their own, so a handler that blocks its thread (which
/// it should not, but CPU-bound or synchronous code does) still keeps its lease while
/// the runtime has another thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_a_handler_blocking_its_thread_keeps_its_lease() {
    let info = run_untaken(|_job: ClaimedJob| async move {
        // Work that never yields (not a wait for anything).
        std::thread::sleep(Duration::from_millis(1200));
        Ok::<_, JobError>(())
    })
    .await;
    assert_eq!(info.attempts, 1);
}

#[tokio::test]
async fn w1_a_revoked_lease_stops_the_handler() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let (handler, stopped) = stoppable();
    let w = builder(&b, &q)
        .lease(Duration::from_millis(300))
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("job running", async || {
        state(&b, &q, id).await == JobState::Running
    })
    .await;
    assert!(b.cancel_job(&q, id).await.unwrap());
    until("handler stopped", async || stopped.load(Ordering::SeqCst)).await;
    w.shutdown().await.unwrap();
    assert_eq!(state(&b, &q, id).await, JobState::Cancelled);
}

#[tokio::test]
async fn w1_lease_is_kept_alive_until_the_outcome_is_settled() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let [blocker, id] = enqueue_n(&b, &q, 2, 3).await[..] else {
        unreachable!()
    };
    // The outcome waits a second in the settler for company, over three leases long:
    // the blocker keeps the worker from running dry, which would settle it at once.
    let (handler, open, _) = blocking(blocker);
    let w = builder(&b, &q)
        .lease(Duration::from_millis(300))
        .settle_delay(Duration::from_secs(1))
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("job running", async || {
        state(&b, &q, id).await == JobState::Running
    })
    .await;
    while state(&b, &q, id).await != JobState::Succeeded {
        let other = b
            .claim(ClaimRequest::new(&q, "thief", 1, Duration::from_secs(30)))
            .await
            .unwrap();
        assert!(
            other.is_empty(),
            "a finished job's lease expired before it was settled"
        );
        sleep(Duration::from_millis(50)).await;
    }
    open.send_replace(true);
    let report = w.shutdown().await.unwrap();
    assert_eq!((report.succeeded, report.lost), (2, 0));
    assert_eq!(b.job(&q, id).await.unwrap().attempts, 1);
}

#[tokio::test]
async fn w1_outcomes_wait_for_company_until_the_worker_runs_dry() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let [blocker, quick] = enqueue_n(&b, &q, 2, 3).await[..] else {
        unreachable!()
    };
    let (handler, open, returned) = blocking(blocker);
    // A minute's delay: only running dry settles within the test's deadline.
    let w = builder(&b, &q)
        .settle_delay(Duration::from_secs(60))
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("both jobs running", async || {
        b.running(&q).await.unwrap().len() == 2
    })
    .await;
    // The quick job's handler returns at once; its outcome waits while the blocker runs.
    until("the quick job's handler returned", async || {
        returned.load(Ordering::SeqCst) == 1
    })
    .await;
    open.send_replace(true);
    until("both jobs succeeded", async || {
        b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == 2
    })
    .await;
    w.shutdown().await.unwrap();
    let ended = |id| {
        let b = b.clone();
        let q = q.clone();
        async move { b.job(&q, id).await.unwrap().attempt_log[0].ended_at }
    };
    // One server time per call: both outcomes went in one settle, once the worker ran dry.
    assert_eq!(ended(blocker).await, ended(quick).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_jobs_claimed_by_a_dry_worker_settle_together() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    // A minute's delay: outcomes are settled only once the worker runs dry again.
    let w = builder(&b, &q)
        .concurrency(20)
        .settle_delay(Duration::from_secs(60))
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    for round in 1..=10u8 {
        // The worker is dry here. The jobs of its next claim end at once, on either
        // thread, and must not be settled one by one as if it still were.
        let ids = enqueue_n(&b, &q, 20, 1).await;
        until("the round succeeded", async || {
            b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == u64::from(round) * 20
        })
        .await;
        let mut ends = HashSet::new();
        for id in ids {
            ends.insert(b.job(&q, id).await.unwrap().attempt_log[0].ended_at);
        }
        assert_eq!(
            ends.len(),
            1,
            "round {round}: 20 outcomes took {} settles",
            ends.len()
        );
    }
    w.shutdown().await.unwrap();
}

#[tokio::test]
async fn w4_dropping_a_worker_stops_its_handlers() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let (handler, stopped) = stoppable();
    let worker = builder(&b, &q).handler(handler).build().unwrap();
    let task = tokio::spawn(worker.run(tokio_util::sync::CancellationToken::new()));
    until("job running", async || {
        state(&b, &q, id).await == JobState::Running
    })
    .await;
    task.abort();
    until("handler stopped with its worker", async || {
        stopped.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test]
async fn w4_shutdown_lets_running_jobs_finish() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 3, 3).await;
    let w = builder(&b, &q)
        .concurrency(3)
        .handler(|_job: ClaimedJob| async move {
            sleep(Duration::from_millis(300)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    until("3 running", async || {
        b.running(&q).await.unwrap().len() == 3
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.succeeded, 3);
    for id in ids {
        assert_eq!(state(&b, &q, id).await, JobState::Succeeded);
    }
}

#[tokio::test]
async fn w4_shutdown_releases_jobs_past_the_deadline() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 4, 3).await;
    let w = builder(&b, &q)
        .concurrency(2)
        .shutdown_timeout(Duration::from_millis(200))
        .handler(|_job: ClaimedJob| async move {
            sleep(Duration::from_secs(60)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    until("2 running", async || {
        b.running(&q).await.unwrap().len() == 2
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.released, 2);
    assert!(
        b.running(&q).await.unwrap().is_empty(),
        "nothing left running"
    );
    let stats = b.queue_stats(&q).await.unwrap();
    assert_eq!(stats.count(JobState::Ready), 4, "{stats:?}");
    for id in ids {
        let info = b.job(&q, id).await.unwrap();
        assert_eq!(info.attempts, 0, "a released attempt is not counted");
    }
}

#[tokio::test]
async fn w2_idle_worker_wakes_on_enqueue_without_waiting_for_a_poll() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let [blocker, first] = enqueue_n(&b, &q, 2, 1).await[..] else {
        unreachable!()
    };
    let (blocking, open, _) = blocking(blocker);
    let blocking = Arc::new(blocking);
    let started = Arc::new(Mutex::new(Vec::new()));
    let seen = started.clone();
    // Polling alone would take 60 s to notice a job once the worker is idle.
    let w = builder(&b, &q)
        .poll_min(Duration::from_secs(60))
        .poll_max(Duration::from_secs(60))
        .settle_delay(Duration::from_millis(50))
        .handler(move |job: ClaimedJob| {
            if job.id() != blocker {
                seen.lock().unwrap().push((job.id(), Instant::now()));
            }
            let blocking = blocking.clone();
            async move { worker::Handler::handle(&*blocking, job).await }
        })
        .build()
        .unwrap()
        .spawn();
    // The worker claims again as soon as the first job's handler returns, finds the
    // queue empty and goes idle. The blocker keeps running, so the first outcome is
    // settled only after the 50 ms settle delay: by the time it shows as succeeded
    // the worker is asleep.
    until("first job succeeded", async || {
        state(&b, &q, first).await == JobState::Succeeded
    })
    .await;
    let enqueued = Instant::now();
    let second = enqueue_n(&b, &q, 1, 1).await[0];
    until("second job started", async || {
        started.lock().unwrap().len() == 2
    })
    .await;
    let (id, at) = started.lock().unwrap()[1];
    assert_eq!(id, second);
    assert!(
        at - enqueued < Duration::from_secs(5),
        "woke after {:?}",
        at - enqueued
    );
    open.send_replace(true);
    w.shutdown().await.unwrap();
}

#[tokio::test]
async fn w5_queues_are_served_in_turn() {
    let b = Arc::new(MemoryBackend::new());
    let (busy, quiet) = (queue(), queue());
    enqueue_n(&b, &busy, 200, 1).await;
    enqueue_n(&b, &quiet, 5, 1).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let w = Worker::builder(b.clone(), [busy.clone(), quiet.clone()])
        .concurrency(1)
        .handler(move |job: ClaimedJob| {
            seen.lock().unwrap().push(job.lease.queue.clone());
            async { Ok::<_, JobError>(()) }
        })
        .build()
        .unwrap()
        .spawn();
    until("quiet queue drained", async || {
        b.queue_stats(&quiet)
            .await
            .unwrap()
            .count(JobState::Succeeded)
            == 5
    })
    .await;
    w.shutdown().await.unwrap();
    let order = order.lock().unwrap();
    let last_quiet = order.iter().rposition(|q| *q == quiet).unwrap();
    assert!(
        last_quiet < 12,
        "quiet queue waited behind the busy one: {last_quiet}"
    );
}

#[test]
fn build_rejects_bad_settings() {
    let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let ok = |_job: ClaimedJob| async { Ok::<_, JobError>(()) };
    let field = |r: Result<Worker>| r.err().and_then(|e| e.invalid_field());
    assert_eq!(
        field(Worker::builder(b.clone(), ["q"]).build()),
        Some("handler")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), Vec::<String>::new())
                .handler(ok)
                .build()
        ),
        Some("queues")
    );
    assert_eq!(
        field(Worker::builder(b.clone(), ["a b"]).handler(ok).build()),
        Some("queue")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), ["q"])
                .concurrency(0)
                .handler(ok)
                .build()
        ),
        Some("concurrency")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), ["q"])
                .prefetch(1001)
                .handler(ok)
                .build()
        ),
        Some("prefetch")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), ["q"])
                .lease(Duration::ZERO)
                .handler(ok)
                .build()
        ),
        Some("lease")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), ["q"])
                .maintenance(Duration::ZERO, Duration::from_secs(60))
                .handler(ok)
                .build()
        ),
        Some("maintenance")
    );
    assert_eq!(
        field(
            Worker::builder(b.clone(), ["q"])
                .cancel_poll(Duration::ZERO)
                .handler(ok)
                .build()
        ),
        Some("cancel_poll")
    );
    for n in [0, relayq_core::progress::MAX_RESULT_BYTES + 1] {
        assert_eq!(
            field(
                Worker::builder(b.clone(), ["q"])
                    .max_result(n)
                    .handler(ok)
                    .build()
            ),
            Some("max_result")
        );
    }
    for n in [0, 1001] {
        assert_eq!(
            field(
                Worker::builder(b.clone(), ["q"])
                    .settle_batch(n)
                    .handler(ok)
                    .build()
            ),
            Some("settle_batch")
        );
    }
    assert_eq!(
        field(
            Worker::builder(b, ["q"])
                .lease(Duration::from_secs(1))
                .heartbeat(Duration::from_secs(2))
                .handler(ok)
                .build()
        ),
        Some("heartbeat")
    );
}

#[tokio::test]
async fn prefetch_claims_ahead_and_runs_each_job_once() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 200, 1).await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    // One server time per claim call: a claim's leases share their expiry.
    let expiries = Arc::new(Mutex::new(HashSet::new()));
    let claimed = expiries.clone();
    let w = builder(&b, &q)
        .concurrency(2)
        .prefetch(50)
        .handler(move |job: ClaimedJob| {
            seen.lock().unwrap().push(job.id());
            claimed.lock().unwrap().insert(job.lease.expires_at);
            async { Ok::<_, JobError>(()) }
        })
        .build()
        .unwrap()
        .spawn();
    until("all jobs succeeded", async || {
        b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == 200
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!((report.claimed, report.succeeded), (200, 200));
    let mut ran = ran.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, ids, "every job ran exactly once");
    // Without prefetch two slots would take ~100 claims.
    let claims = expiries.lock().unwrap().len();
    assert!(claims <= 20, "200 jobs took {claims} claims");
}

#[tokio::test]
async fn prefetch_releases_buffered_jobs_at_shutdown() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 6, 3).await;
    let (handler, _) = stoppable();
    let w = builder(&b, &q)
        .concurrency(1)
        .prefetch(5)
        .shutdown_timeout(Duration::from_millis(100))
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("1 running and 5 buffered, all leased", async || {
        b.running(&q).await.unwrap().len() == 6
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!((report.claimed, report.released), (6, 6));
    for id in ids {
        let info = b.job(&q, id).await.unwrap();
        assert_eq!(info.state, JobState::Ready);
        assert_eq!(info.attempts, 0, "a released attempt is not counted");
    }
}

#[tokio::test]
async fn prefetch_releases_jobs_held_past_a_heartbeat_and_does_not_reclaim_them() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 4, 3).await;
    let (handler, _) = stoppable();
    let hold = Duration::from_millis(100);
    let w = builder(&b, &q)
        .concurrency(1)
        .prefetch(3)
        .lease(Duration::from_secs(30))
        .heartbeat(hold)
        .shutdown_timeout(Duration::from_millis(100))
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("all 4 leased", async || {
        b.running(&q).await.unwrap().len() == 4
    })
    .await;
    until("the 3 buffered released", async || {
        b.queue_stats(&q).await.unwrap().count(JobState::Ready) == 3
    })
    .await;
    // The slot stays busy, so nothing left the buffer: refilling it would only claim
    // and release the same jobs again. Watch for ten hold periods.
    let watch = Instant::now() + hold * 10;
    while Instant::now() < watch {
        assert_eq!(b.running(&q).await.unwrap().len(), 1, "buffer refilled");
        sleep(Duration::from_millis(10)).await;
    }
    for id in &ids[1..] {
        let info = b.job(&q, *id).await.unwrap();
        assert_eq!(info.attempts, 0, "a released attempt is not counted");
        assert_eq!(info.attempt_log.len(), 1, "claimed once, released once");
    }
    w.shutdown().await.unwrap();
}

/// SPEC S5: a worker fires the due slots of its queues' schedules by default, and
/// runs the jobs they make.
#[tokio::test]
async fn s5_a_worker_fires_its_queues_schedules() {
    use relayq_core::{Schedules, schedule::Schedule};
    let backend = Arc::new(MemoryBackend::new());
    let q = queue();
    backend
        .put_schedule(
            &Schedule::new(&q, "tick", "* * * * * *").job(relayq_core::NewJob::new(&q, vec![])),
        )
        .await
        .unwrap();
    let worker = builder(&backend, &q)
        .handler(|_job: relayq_core::ClaimedJob| async { Ok::<_, worker::JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    until("a slot's job to succeed", async || {
        backend
            .queue_stats(&q)
            .await
            .unwrap()
            .count(JobState::Succeeded)
            >= 1
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// SPEC L5 (finding: jobs claimed ahead were logged as running): a worker of two slots
/// that claims ahead into its buffer logs no more than two attempts running at any
/// moment; a job's attempt starts when its handler did, not at its claim.
#[tokio::test]
async fn l5_a_buffered_job_is_logged_from_its_start_not_its_claim() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let ids = enqueue_n(&b, &q, 12, 1).await;
    // Each outcome stored at once: an attempt's logged end is its settle's time.
    let w = builder(&b, &q)
        .concurrency(2)
        .prefetch(10)
        .settle_delay(Duration::ZERO)
        .handler(|_job: ClaimedJob| async {
            sleep(Duration::from_millis(40)).await;
            Ok::<_, JobError>(())
        })
        .build()
        .unwrap()
        .spawn();
    until("all jobs succeeded", async || {
        b.queue_stats(&q).await.unwrap().count(JobState::Succeeded) == 12
    })
    .await;
    w.shutdown().await.unwrap();
    let mut spans = Vec::new();
    for id in ids {
        let a = &b.job(&q, id).await.unwrap().attempt_log[0];
        spans.push((a.started_at, a.ended_at.unwrap()));
    }
    // At each attempt's start, how many attempts (itself included) were running. An
    // end is logged when its settle is stored, a moment after the handler returned
    // and its slot took the next job, and a wait under 10 ms is not reported: up to
    // about 15 ms of overlap are those.
    let slack = chrono::TimeDelta::milliseconds(15);
    let most = spans
        .iter()
        .map(|(s, _)| {
            spans
                .iter()
                .filter(|(s2, e2)| s2 <= s && *s < *e2 - slack)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most <= 2,
        "{most} attempts overlapped on a worker of 2 slots: {spans:?}"
    );
}

/// Claims of one queue take 300 ms; everything else is the memory backend's.
struct SlowQueue {
    inner: Arc<MemoryBackend>,
    slow: String,
}

relayq_core::delegate!(SlowQueue, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin, Schedules);

#[async_trait]
impl Claim for SlowQueue {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        if req.queue == self.slow {
            sleep(Duration::from_millis(300)).await;
        }
        self.inner.claim_unchecked(req).await
    }
}

/// SPEC L5: a worker of two queues claims them one after the other; a job of the
/// second is logged from its handler's start, not a round trip of the first queue
/// later (its wait counts from its own queue's claim, not the round's start).
#[tokio::test]
async fn l5_a_second_queue_s_job_is_logged_from_its_own_claim() {
    let inner = Arc::new(MemoryBackend::new());
    let (slow, q) = (queue(), queue());
    let id = enqueue_n(&inner, &q, 1, 1).await[0];
    let b: Arc<dyn Backend> = Arc::new(SlowQueue {
        inner: inner.clone(),
        slow: slow.clone(),
    });
    let started = Arc::new(Mutex::new(None));
    let seen = started.clone();
    let w = Worker::builder(b, [slow, q.clone()])
        .settle_delay(Duration::ZERO)
        .handler(move |_job: ClaimedJob| {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() = Some(chrono::Utc::now());
                // Long enough that a start logged too late is not cut back to the end.
                sleep(Duration::from_millis(400)).await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    until("the job succeeded", async || {
        state(&inner, &q, id).await == JobState::Succeeded
    })
    .await;
    w.shutdown().await.unwrap();
    let logged = inner.job(&q, id).await.unwrap().attempt_log[0].started_at;
    let started = started.lock().unwrap().expect("the handler ran");
    assert!(
        logged <= started + chrono::TimeDelta::milliseconds(50),
        "logged start {logged} is after the handler's start {started}"
    );
}

/// SPEC K6: a worker claiming ahead never takes its key's last free slot, so while it
/// is busy another worker runs the key's next job: it is never claimed into the first
/// worker's buffer at all.
#[tokio::test]
async fn k6_a_claim_ahead_leaves_a_key_s_last_slot_to_other_workers() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    b.set_key_limit(&q, Some("db"), Some(2)).await.unwrap();
    let jobs = (0..2)
        .map(|i| NewJob::new(&q, vec![i]).limit_key("db"))
        .collect();
    let ids: Vec<JobId> = b
        .enqueue(jobs)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let (handler, open, _) = blocking(ids[0]);
    let busy = builder(&b, &q)
        .name("busy")
        .concurrency(1)
        .prefetch(10)
        .handler(handler)
        .build()
        .unwrap()
        .spawn();
    until("the first job runs", async || {
        state(&b, &q, ids[0]).await == JobState::Running
    })
    .await;
    let free = builder(&b, &q)
        .name("free")
        .concurrency(1)
        .prefetch(0)
        .handler(|_: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    until("the second job succeeded", async || {
        state(&b, &q, ids[1]).await == JobState::Succeeded
    })
    .await;
    let log = b.job(&q, ids[1]).await.unwrap().attempt_log;
    let workers: Vec<&str> = log.iter().map(|a| a.worker.as_str()).collect();
    assert_eq!(workers, ["free"], "the second job's attempts: {log:?}");
    open.send(true).unwrap();
    busy.shutdown().await.unwrap();
    free.shutdown().await.unwrap();
}

/// Every claim a worker sends: when it was sent, when it was answered, and the wait
/// its answer named.
struct Paced {
    inner: Arc<MemoryBackend>,
    calls: Mutex<Vec<(Instant, Instant, Option<Duration>)>>,
}

relayq_core::delegate!(Paced, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin, Schedules);

#[async_trait]
impl Claim for Paced {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<Claimed> {
        let sent = Instant::now();
        let got = self.inner.claim_paced_unchecked(req).await?;
        self.calls
            .lock()
            .unwrap()
            .push((sent, Instant::now(), got.next_in));
        Ok(got)
    }
}

/// SPEC K10: a worker whose claim the queue's rate cut short claims that queue again
/// only when the wait the claim named is over, and then at once: with polls an hour
/// apart, 12 jobs under a rate of 40 a second all run, and no claim came early.
#[tokio::test]
async fn k10_a_worker_sleeps_the_rate_s_wait_instead_of_polling() {
    let inner = Arc::new(MemoryBackend::new());
    let q = queue();
    let rate = Rate::new(40, Duration::from_secs(1));
    inner
        .update_queue(&q, QueueUpdate::default().rate(Some(rate)))
        .await
        .unwrap();
    let b = Arc::new(Paced {
        inner: inner.clone(),
        calls: Mutex::new(Vec::new()),
    });
    let hour = Duration::from_secs(3600);
    let w = Worker::builder(b.clone(), [q.clone()])
        .concurrency(4)
        .poll_min(hour)
        .poll_max(hour)
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    // Enqueued after the worker's first claim found the queue empty.
    until("the worker's first claim", async || {
        !b.calls.lock().unwrap().is_empty()
    })
    .await;
    let ids = enqueue_n(&inner, &q, 12, 1).await;
    until("all 12 jobs succeeded", async || {
        for id in &ids {
            if state(&inner, &q, *id).await != JobState::Succeeded {
                return false;
            }
        }
        true
    })
    .await;
    w.shutdown().await.unwrap();
    let calls = b.calls.lock().unwrap().clone();
    let cut = calls.iter().filter(|c| c.2.is_some()).count();
    assert!(
        cut >= 5,
        "only {cut} of {} claims were cut by the rate",
        calls.len()
    );
    // A claim already in flight when the wait was named may come back; none may be
    // sent before the wait is over.
    for &(_, answered, wait) in &calls {
        let Some(wait) = wait else { continue };
        for &(sent, ..) in &calls {
            assert!(
                sent <= answered || sent >= answered + wait,
                "a claim was sent {:?} after one that named a wait of {wait:?}",
                sent - answered
            );
        }
    }
}

/// SPEC K13: an idle worker claims again when a key its rate held allows a start, not
/// at its next poll: with polls an hour apart, four jobs of a key under 1 per 150 ms all
/// run, one about every 150 ms, while a job of another key runs at once.
#[tokio::test]
async fn k13_a_worker_claims_again_when_a_held_key_wakes() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let rate = Rate::new(1, Duration::from_millis(150));
    b.set_key_rate(&q, Some("slow"), Some(rate)).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..4 {
        let job = NewJob::new(&q, format!("s{i}").into_bytes()).limit_key("slow");
        ids.push(b.enqueue_one(job).await.unwrap().id);
    }
    let other = b
        .enqueue_one(NewJob::new(&q, b"o".to_vec()).limit_key("other"))
        .await
        .unwrap()
        .id;
    let hour = Duration::from_secs(3600);
    let started = Instant::now();
    let w = Worker::builder(b.clone(), [q.clone()])
        .concurrency(4)
        .poll_min(hour)
        .poll_max(hour)
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    until("the other key's job succeeded", async || {
        state(&b, &q, other).await == JobState::Succeeded
    })
    .await;
    until("the held key's four jobs succeeded", async || {
        for id in &ids {
            if state(&b, &q, *id).await != JobState::Succeeded {
                return false;
            }
        }
        true
    })
    .await;
    let took = started.elapsed();
    w.shutdown().await.unwrap();
    // Three waits of 150 ms after the first start.
    assert!(
        took >= Duration::from_millis(400),
        "four starts under 1/150ms took {took:?}"
    );
}

/// SPEC K10: a worker waits for a rate's named wait at most its longest poll interval,
/// so a rate lifted meanwhile is seen: under 1 per hour the second job waits; once the
/// rate is lifted it runs, with polls 200 ms apart (without the bound, in an hour).
#[tokio::test]
async fn k10_a_lifted_rate_is_seen_within_the_longest_poll() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let hourly = Rate::new(1, Duration::from_secs(3600));
    b.update_queue(&q, QueueUpdate::default().rate(Some(hourly)))
        .await
        .unwrap();
    let ids = enqueue_n(&b, &q, 2, 1).await;
    let w = Worker::builder(b.clone(), [q.clone()])
        .poll_min(Duration::from_millis(50))
        .poll_max(Duration::from_millis(200))
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    until("the first job succeeded", async || {
        state(&b, &q, ids[0]).await == JobState::Succeeded
    })
    .await;
    assert_eq!(
        state(&b, &q, ids[1]).await,
        JobState::Ready,
        "the rate lets one job start an hour"
    );
    b.update_queue(&q, QueueUpdate::default().rate(None))
        .await
        .unwrap();
    until(
        "the second job succeeded once the rate was lifted",
        async || state(&b, &q, ids[1]).await == JobState::Succeeded,
    )
    .await;
    w.shutdown().await.unwrap();
}
