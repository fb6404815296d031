//! What a handler is told about its lease, and the worker's report when leases are
//! lost (SPEC W1): the `JobContext` token fires at the lease's deadline less
//! the margin when no heartbeat gets through, renewals move the deadline, and every
//! claimed job ends in exactly one counter of the report.

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use relayq_core::{
    memory::MemoryBackend,
    worker::{JobContext, JobError, LeaseDeadline, Worker},
    *,
};
use support::{
    enqueue_n,
    faulty::{Beats, Faulty},
    queue, until,
};
use tokio::time::Instant;

/// What the handler of the first attempt saw: its deadline when it started, and when
/// the task it spawned (which the worker cannot drop) saw the token fire.
#[derive(Default)]
struct Seen {
    deadline: Option<LeaseDeadline>,
    fired_at: Option<Instant>,
}

/// With every heartbeat failing, the token fires at the deadline's `stop_at`, before
/// the lease ends and before the job is claimed again; a spawned task that obeys it
/// stops there although the handler itself ignores it.
#[tokio::test]
async fn w1_the_stopping_token_fires_before_the_lease_ends_when_no_beat_gets_through() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    let id = enqueue_n(&b, &q, 1, 3).await[0];
    let seen = Arc::new(Mutex::new(Seen::default()));
    let seen2 = seen.clone();
    let lease = Duration::from_millis(600);
    let w = Worker::builder(Faulty::new(&b, Beats::Fail), [q.clone()])
        .concurrency(2)
        .lease(lease)
        .handler(move |job: ClaimedJob| {
            let seen = seen2.clone();
            async move {
                let ctx = JobContext::current().expect("a handler has a context");
                if job.attempt() == 1 {
                    seen.lock().unwrap().deadline = ctx.deadline();
                    let token = ctx.stopping();
                    // Work outside the handler's future: only the token reaches it.
                    tokio::spawn(async move {
                        token.cancelled().await;
                        seen.lock().unwrap().fired_at = Some(Instant::now());
                    });
                }
                // Ignores the token.
                tokio::time::sleep(Duration::from_secs(60)).await;
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
    let second_claim = Instant::now();
    w.shutdown().await.unwrap();
    let seen = seen.lock().unwrap();
    let deadline = seen
        .deadline
        .expect("the deadline was set before the handler ran");
    let fired = seen.fired_at.expect("the token fired");
    assert!(
        fired >= deadline.stop_at,
        "fired {:?} before stop_at",
        deadline.stop_at - fired
    );
    assert!(
        fired < deadline.lease_ends,
        "fired {:?} after the lease ended",
        fired - deadline.lease_ends
    );
    assert!(fired < second_claim, "the token fired after the next claim");
    assert!(deadline.margin() > Duration::ZERO && deadline.margin() < lease);
}

/// Each heartbeat that gets through moves the deadline on; outside a handler there is
/// no context.
#[tokio::test]
async fn w1_renewals_move_the_deadline_on() {
    assert!(JobContext::current().is_none());
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    enqueue_n(&b, &q, 1, 1).await;
    let stops = Arc::new(Mutex::new(Vec::new()));
    let stops2 = stops.clone();
    let w = Worker::builder(b.clone(), [q.clone()])
        .lease(Duration::from_millis(300))
        .handler(move |_job: ClaimedJob| {
            let stops = stops2.clone();
            async move {
                let ctx = JobContext::current().expect("context");
                let mut deadlines = ctx.deadlines();
                stops.lock().unwrap().push(ctx.deadline().unwrap().stop_at);
                // Three renewals, each seen as a change.
                for _ in 0..3 {
                    deadlines.changed().await.unwrap();
                    let d = deadlines.borrow_and_update().unwrap();
                    stops.lock().unwrap().push(d.stop_at);
                }
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    until("three renewals seen", async || {
        stops.lock().unwrap().len() == 4
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.succeeded, 1);
    let stops = stops.lock().unwrap();
    assert!(stops.windows(2).all(|w| w[1] > w[0]), "{stops:?}");
}

/// With one lease lost (its job cancelled while it runs, so the next
/// beat finds the lease stale) among jobs that succeed and fail, the report's counters
/// add up to what was claimed, and the lost lease is counted as such.
#[tokio::test]
async fn the_report_adds_up_when_a_lease_is_lost() {
    let b = Arc::new(MemoryBackend::new());
    let q = queue();
    // Payload 0 runs until stopped; 1..=3 succeed; 4..=5 fail for good.
    let ids = enqueue_n(&b, &q, 6, 1).await;
    let stopped = Arc::new(AtomicBool::new(false));
    let stopped2 = stopped.clone();
    let w = Worker::builder(b.clone(), [q.clone()])
        .concurrency(3)
        .lease(Duration::from_millis(300))
        .handler(move |job: ClaimedJob| {
            let flag = SetOnDrop(stopped2.clone());
            async move {
                match job.payload[0] {
                    0 => tokio::time::sleep(Duration::from_secs(60)).await,
                    1..=3 => std::mem::forget(flag),
                    _ => {
                        std::mem::forget(flag);
                        return Err(JobError::permanent("fails, for the test"));
                    }
                }
                Ok(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    until("the long job running", async || {
        b.job(&q, ids[0]).await.unwrap().state == JobState::Running
    })
    .await;
    assert!(b.cancel_job(&q, ids[0]).await.unwrap());
    // Its handler is stopped at its next beat (every 100 ms).
    until("the cancelled job's handler stopped", async || {
        stopped.load(Ordering::SeqCst)
    })
    .await;
    until("the others finished", async || {
        let mut done = 0;
        for id in &ids[1..] {
            let s = b.job(&q, *id).await.unwrap().state;
            done += u8::from(matches!(s, JobState::Succeeded | JobState::Dead));
        }
        done == 5
    })
    .await;
    let report = w.shutdown().await.unwrap();
    assert_eq!(report.claimed, 6, "{report:?}");
    assert_eq!(report.succeeded, 3, "{report:?}");
    assert_eq!(report.failed, 2, "{report:?}");
    assert_eq!(report.lease_lost, 1, "{report:?}");
    assert_eq!(report.ended(), report.claimed, "{report:?}");
}

/// Sets its flag when dropped: the handler's future was dropped mid-run.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
