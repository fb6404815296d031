//! Connections killed under a running worker (`CLIENT KILL`). In a test binary of their
//! own: `CLIENT KILL TYPE normal` drops every client of the server, and the tests run
//! beside it in one binary lost their connections mid-call ("broken pipe").

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use relayq_conformance::{poll_until, queue_name};
use relayq_core::{
    Backend, ClaimedJob, Enqueue, EnqueueExt, Inspect, JobState, NewJob,
    worker::{JobError, Worker},
};
use relayq_redis::RedisBackend;

mod support;
use support::{PREFIX, jobs, setup};

/// Connections killed with `CLIENT KILL` while a worker drains a queue: it reconnects,
/// every job ends succeeded, and no job is ever run by two handlers at once.
async fn killed_connections_lose_no_job_and_hold_none_twice(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("kill");
    let n = 300;
    b.enqueue(jobs(&q, n)).await.unwrap();
    let running: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<i64>>> = Arc::default();
    let (r, o) = (running.clone(), overlaps.clone());
    let backend: Arc<dyn Backend> = Arc::new(b.clone());
    let worker = Worker::builder(backend, [q.clone()])
        .concurrency(8)
        .lease(Duration::from_secs(1))
        .handler(move |job: ClaimedJob| {
            let (r, o) = (r.clone(), o.clone());
            async move {
                let id = job.lease.job.0;
                if !r.lock().unwrap().insert(id) {
                    o.lock().unwrap().push(id);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                r.lock().unwrap().remove(&id);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let stats = poll_until("every job succeeded", Duration::from_secs(60), || async {
        let s = b.queue_stats(&q).await?;
        Ok((s.count(JobState::Succeeded) == n as u64).then_some(s))
    })
    .await
    .unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(stats.total(), n as u64, "{stats:?}");
    assert!(
        overlaps.lock().unwrap().is_empty(),
        "held twice: {overlaps:?}"
    );
}

/// Nothing grows without bound: after 10,000 jobs are drained and pruned with zero
/// retention, the queue's keys and their memory are back to the baseline of a queue
/// whose one job was drained and pruned.
/// An idle worker whose poll fallback is a minute wakes on a job enqueued through
/// another handle (pub/sub), and still does after its subscriber connection is killed:
/// the subscriber comes back and tells waiters to check (`Resync`).
async fn published_wakeups_survive_a_killed_subscriber(url: String) {
    let (b, mut raw) = setup(&url).await;
    let other = RedisBackend::connect_with_prefix(&url, PREFIX)
        .await
        .unwrap();
    let q = queue_name("wake");
    // Subscribed first, so the subscriber's first Resync reaches this receiver.
    let mut events = relayq_core::Events::subscribe(&b).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let backend: Arc<dyn Backend> = Arc::new(b.clone());
    let worker = Worker::builder(backend, [q.clone()])
        .poll_min(Duration::from_secs(60))
        .poll_max(Duration::from_secs(60))
        .handler(move |job: ClaimedJob| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(job.lease.job);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap()
        .spawn();
    // Wait until the subscriber is up (its first Resync), then enqueue elsewhere.
    tokio::time::timeout(Duration::from_secs(10), async {
        while events.recv().await.unwrap().kind != relayq_core::EventKind::Resync {}
    })
    .await
    .expect("subscriber up");
    let first = other.enqueue_one(NewJob::new(&q, vec![])).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(got.unwrap(), Some(first.id));

    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while events.recv().await.unwrap().kind != relayq_core::EventKind::Resync {}
    })
    .await
    .expect("a Resync after the reconnect");
    let second = other.enqueue_one(NewJob::new(&q, vec![])).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(got.unwrap(), Some(second.id));
    worker.shutdown().await.unwrap();
}

relayq_conformance::server_tests! {
    server: relayq_conformance::harness::Server::of(&relayq_redis::DRIVER),
    tests: [
        killed_connections_lose_no_job_and_hold_none_twice,
        published_wakeups_survive_a_killed_subscriber,
    ],
}
