//! The cache's rules, over the in-memory backend with a count whose cost the test sets.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use relayq_core::{
    Admin, EnqueueExt, Error, Inspect, JobId, JobInfo, JobState, NewJob, QueueStats, Result,
    RunningJob, async_trait, memory::MemoryBackend,
};

use super::*;

/// The memory backend, with `queue_stats` taking `cost_ms` (a stand-in for a big
/// table's scan) or failing, and counted.
struct Costly {
    inner: MemoryBackend,
    cost_ms: AtomicU64,
    fail: AtomicBool,
    panic: AtomicBool,
    counts: AtomicU64,
}

relayq_core::delegate!(Costly, inner => Events, Enqueue, Claim, Complete, OrderBarrier, Admin, Schedules);

#[async_trait]
impl Inspect for Costly {
    async fn queue_stats_unchecked(&self, queue: &str) -> Result<QueueStats> {
        self.counts.fetch_add(1, Ordering::SeqCst);
        // Read first, then take the time: what the count says is as of its start.
        let stats = self.inner.queue_stats_unchecked(queue).await;
        tokio::time::sleep(Duration::from_millis(self.cost_ms.load(Ordering::SeqCst))).await;
        assert!(!self.panic.load(Ordering::SeqCst), "a count that panics");
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::transient(std::io::Error::other("server gone")));
        }
        stats
    }
    async fn job_unchecked(&self, queue: &str, id: JobId) -> Result<JobInfo> {
        self.inner.job_unchecked(queue, id).await
    }
    async fn key_limits_unchecked(&self, queue: &str) -> Result<relayq_core::KeyLimits> {
        self.inner.key_limits_unchecked(queue).await
    }
    async fn running_unchecked(&self, queue: &str) -> Result<Vec<RunningJob>> {
        self.inner.running_unchecked(queue).await
    }
    async fn group_holder_unchecked(&self, queue: &str, group: &str) -> Result<Option<JobId>> {
        self.inner.group_holder_unchecked(queue, group).await
    }
    async fn batches_unchecked(
        &self,
        queue: &str,
        limit: u32,
    ) -> Result<Vec<relayq_core::BatchProgress>> {
        self.inner.batches_unchecked(queue, limit).await
    }
    async fn batch_jobs_unchecked(
        &self,
        batch: &relayq_core::Batch,
        after: Option<JobId>,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        self.inner.batch_jobs_unchecked(batch, after, limit).await
    }
    async fn workers_unchecked(&self, queue: &str) -> Result<Vec<relayq_core::WorkerSeen>> {
        self.inner.workers_unchecked(queue).await
    }
    async fn list_jobs_unchecked(
        &self,
        queue: &str,
        filter: &relayq_core::JobFilter,
        before: Option<JobId>,
        limit: u32,
    ) -> Result<relayq_core::JobPage> {
        self.inner
            .list_jobs_unchecked(queue, filter, before, limit)
            .await
    }
    async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> Result<Vec<JobInfo>> {
        self.inner.dead_jobs_unchecked(queue, limit).await
    }
    async fn queues(&self) -> Result<Vec<String>> {
        self.inner.queues().await
    }
}

fn costly(cost_ms: u64) -> Arc<Costly> {
    Arc::new(Costly {
        inner: MemoryBackend::new(),
        cost_ms: AtomicU64::new(cost_ms),
        fail: AtomicBool::new(false),
        panic: AtomicBool::new(false),
        counts: AtomicU64::new(0),
    })
}

async fn add(b: &Costly, queue: &str) {
    b.inner
        .enqueue_one(NewJob::new(queue, b"x".to_vec()))
        .await
        .unwrap();
}

fn ready(answer: &Answer) -> Option<u64> {
    answer
        .as_ref()
        .unwrap()
        .as_ref()
        .map(|c| c.stats.count(JobState::Ready))
}

/// Asks until `want` holds, for up to 10 s.
async fn until(counts: &Counts, queue: &str, want: impl Fn(&Answer) -> bool) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = counts.get(queue).await;
        if want(&answer) || Instant::now() > deadline {
            return answer;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_cheap_queue_is_counted_for_every_request() {
    let b = costly(0);
    let counts = Counts::new(b.clone());
    add(&b, "q").await;
    assert_eq!(ready(&counts.get("q").await), Some(1));
    add(&b, "q").await;
    assert_eq!(ready(&counts.get("q").await), Some(2), "exact at once");
    assert_eq!(b.counts.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_slow_queue_answers_at_once_from_its_last_count_and_counts_again_later() {
    let b = costly(300);
    let counts = Counts::new(b.clone());
    add(&b, "q").await;

    // The first count outlasts the wait: "counting", within about WAIT.
    let t = Instant::now();
    assert!(counts.get("q").await.unwrap().is_none());
    assert!(
        t.elapsed() < WAIT + Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    let first = until(&counts, "q", |a| ready(a).is_some()).await;
    assert_eq!(ready(&first), Some(1));
    assert_eq!(
        b.counts.load(Ordering::SeqCst),
        1,
        "one count, however many asked"
    );

    // A new job: the next answers are the last count, given at once, until it is
    // older than ten times the 300 ms it took.
    add(&b, "q").await;
    let t = Instant::now();
    assert_eq!(ready(&counts.get("q").await), Some(1));
    assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    let later = until(&counts, "q", |a| ready(a) == Some(2)).await;
    assert_eq!(ready(&later), Some(2), "counted again in the background");
    let first_at = first.unwrap().unwrap().at;
    assert!(later.unwrap().unwrap().at > first_at);
}

#[tokio::test]
async fn an_action_shows_its_setting_at_once_and_counts_again() {
    let b = costly(300);
    let counts = Counts::new(b.clone());
    add(&b, "q").await;
    let counted = until(&counts, "q", |a| ready(a).is_some()).await;
    assert_eq!(ready(&counted), Some(1));
    b.pause("q").await.unwrap();
    counts.changed("q", Change::Paused(true));
    let answer = counts.get("q").await.unwrap().unwrap();
    assert!(
        answer.stats.paused,
        "the action's setting, before any new count"
    );
    let before = b.counts.load(Ordering::SeqCst);
    let _ = until(&counts, "q", |_| b.counts.load(Ordering::SeqCst) > before).await;
    assert!(
        b.counts.load(Ordering::SeqCst) > before,
        "a new count started"
    );
}

#[tokio::test]
async fn a_failed_count_is_an_error_and_the_next_request_counts_again() {
    let b = costly(0);
    b.fail.store(true, Ordering::SeqCst);
    let counts = Counts::new(b.clone());
    assert!(counts.get("q").await.is_err());
    b.fail.store(false, Ordering::SeqCst);
    assert_eq!(ready(&counts.get("q").await), Some(0));
}

#[tokio::test]
async fn many_queues_share_one_wait() {
    let b = costly(300);
    let counts = Counts::new(b.clone());
    let names: Vec<String> = (0..20).map(|i| format!("q{i}")).collect();
    let t = Instant::now();
    let answers = counts.get_many(&names).await;
    assert!(
        t.elapsed() < WAIT + Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert!(answers.iter().all(|a| matches!(a, Ok(None))));
}

#[tokio::test]
async fn an_action_during_a_count_is_not_undone_by_it() {
    let b = costly(300);
    let counts = Counts::new(b.clone());
    add(&b, "q").await;
    // The first count reads the queue unpaused, then takes 300 ms; the pause comes
    // in between.
    assert!(counts.get("q").await.unwrap().is_none());
    b.pause("q").await.unwrap();
    counts.changed("q", Change::Paused(true));
    let answer = until(&counts, "q", |a| ready(a).is_some()).await;
    assert!(
        answer.unwrap().unwrap().stats.paused,
        "the count undid the pause"
    );
}

#[tokio::test]
async fn a_count_that_panics_is_an_error_and_the_queue_is_counted_again() {
    let b = costly(0);
    b.panic.store(true, Ordering::SeqCst);
    let counts = Counts::new(b.clone());
    let failed = until(&counts, "q", Result::is_err).await;
    assert!(failed.is_err());
    b.panic.store(false, Ordering::SeqCst);
    let answer = until(&counts, "q", |a| ready(a).is_some()).await;
    assert_eq!(
        ready(&answer),
        Some(0),
        "never counted again after the panic"
    );
}

/// The charts' samples come for every queue in use while the dashboard runs, with no
/// page asking for that queue; and the sampler ends with the dashboard's state.
#[tokio::test]
async fn every_queue_in_use_is_sampled_without_a_request() {
    let backend = Arc::new(MemoryBackend::new());
    let q = format!("sampled-{}", uuid::Uuid::new_v4().simple());
    backend
        .enqueue_one(NewJob::new(&q, b"x".to_vec()))
        .await
        .unwrap();
    let state = crate::state::AppState::new(backend.clone(), crate::Options::default());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while state.counts.history(&q).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no sample of a queue in use within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state.counts.history(&q)[0].ready, 1);
    // A pass in progress holds the state until it ends; none holds it after.
    let weak = Arc::downgrade(&state.0);
    drop(state);
    while weak.strong_count() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sampler still holds the dropped state"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sampler's pace: `count_due` returns only once the counts it started have
/// ended, slow ones (past `WAIT`) included, so a pass has no more running at once
/// than it asked for.
#[tokio::test]
async fn count_due_waits_for_slow_counts() {
    let b = costly(300);
    let queues: Vec<String> = (0..3).map(|i| format!("slow{i}")).collect();
    for q in &queues {
        add(&b, q).await;
    }
    let counts = Counts::new(b.clone());
    counts.count_due(&queues, Duration::from_secs(10)).await;
    assert_eq!(b.counts.load(Ordering::SeqCst), 3);
    let entries = counts.lock();
    for q in &queues {
        let e = entries.get(q).expect("an entry");
        assert!(e.running.is_none(), "{q}: a count still runs");
        assert!(matches!(&e.last, Some(Ok(_))), "{q}: no answer");
    }
}
