//! Helpers shared by the worker tests.

// Each test file compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use relayq_core::{
    memory::MemoryBackend,
    worker::{JobError, Worker, WorkerBuilder},
    *,
};
use tokio::time::{Instant, sleep};

pub mod faulty;

pub const DEADLINE: Duration = Duration::from_secs(15);

pub fn queue() -> String {
    format!("w.{}", uuid::Uuid::new_v4().simple())
}

pub fn builder(backend: &Arc<MemoryBackend>, q: &str) -> WorkerBuilder {
    Worker::builder(backend.clone(), [q.to_owned()])
}

pub async fn enqueue_n(b: &MemoryBackend, q: &str, n: u8, max_attempts: u16) -> Vec<JobId> {
    let jobs = (0..n)
        .map(|i| NewJob::new(q, vec![i]).max_attempts(max_attempts))
        .collect();
    b.enqueue(jobs)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Polls `check` until true, failing the test after [`DEADLINE`].
pub async fn until<F: AsyncFnMut() -> bool>(what: &str, mut check: F) {
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

pub async fn state(b: &MemoryBackend, q: &str, id: JobId) -> JobState {
    b.job(q, id).await.unwrap().state
}

/// A handler that runs for a minute, and a flag set when it stops early (its future is
/// dropped).
pub fn stoppable() -> (impl worker::Handler, Arc<AtomicBool>) {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let handler = move |_job: ClaimedJob| {
        let guard = Flag(flag.clone());
        async move {
            sleep(Duration::from_secs(60)).await;
            drop(guard);
            Ok::<_, JobError>(())
        }
    };
    (handler, stopped)
}
