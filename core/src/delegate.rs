//! [`delegate!`](crate::delegate): a wrapper's trait impls that pass every call to the
//! backend it wraps, for wrappers that change one or two methods (a timer around
//! claims, faults injected into settles) and must not lose the others' overrides
//! (`reached_unchecked`, `try_maintain_unchecked`, `preferred_settle_batch`, `limits`)
//! by writing them out by hand. A wrapper implements the `*_unchecked` methods: the
//! public ones validate once, on the outermost wrapper, and call those.

/// Implements the named backend traits for a wrapper by passing each method, overrides
/// included, to one of its fields (an `Arc<dyn Backend>`, an `Arc<B>` or a `B`); the
/// wrapper writes the traits it changes itself.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
/// use relayq_core::{async_trait, Backend, Claim, ClaimRequest, Claimed, ClaimedJob, Result};
///
/// /// Counts claims; everything else is the inner backend's.
/// struct Counted {
///     inner: Arc<dyn Backend>,
///     claims: AtomicU64,
/// }
///
/// relayq_core::delegate!(Counted, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin, Schedules);
///
/// // The worker claims with `claim_paced`: a wrapper that overrides only
/// // `claim_unchecked` drops the wait a rate names (SPEC K10), and its workers poll.
/// #[async_trait]
/// impl Claim for Counted {
///     async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
///         Ok(self.claim_paced_unchecked(req).await?.jobs)
///     }
///     async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<Claimed> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim_paced_unchecked(req).await
///     }
/// }
///
/// let b: Arc<dyn Backend> = Arc::new(Counted {
///     inner: Arc::new(relayq_core::memory::MemoryBackend::new()),
///     claims: AtomicU64::new(0),
/// });
/// ```
#[macro_export]
macro_rules! delegate {
    // Each method brings its trait into scope (`use Trait as _`), so that the call
    // resolves whatever the field is (`Arc<dyn Backend>`, `Arc<B>`, `B`); the import is
    // unused where the caller has the trait in scope already, hence the allows.
    ($ty:ty, $field:tt => $($tr:ident),+ $(,)?) => {
        $($crate::delegate!(@$tr $ty, $field);)+
    };
    (@Events $ty:ty, $f:tt) => {
        impl $crate::Events for $ty {
            fn subscribe(&self) -> Option<$crate::__private::Receiver<$crate::Event>> {
                #[allow(unused_imports)]
                use $crate::Events as _;
                self.$f.subscribe()
            }
            fn pushes_revocations(&self) -> bool {
                #[allow(unused_imports)]
                use $crate::Events as _;
                self.$f.pushes_revocations()
            }
        }
    };
    (@Enqueue $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Enqueue for $ty {
            async fn enqueue_unchecked(&self, jobs: Vec<$crate::NewJob>) -> $crate::Result<Vec<$crate::Enqueued>> {
                #[allow(unused_imports)]
                use $crate::Enqueue as _;
                self.$f.enqueue_unchecked(jobs).await
            }
            fn limits(&self) -> $crate::Limits {
                #[allow(unused_imports)]
                use $crate::Enqueue as _;
                self.$f.limits()
            }
        }
    };
    (@Claim $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Claim for $ty {
            async fn claim_unchecked(&self, req: $crate::ClaimRequest) -> $crate::Result<Vec<$crate::ClaimedJob>> {
                #[allow(unused_imports)]
                use $crate::Claim as _;
                self.$f.claim_unchecked(req).await
            }
            async fn claim_paced_unchecked(&self, req: $crate::ClaimRequest) -> $crate::Result<$crate::Claimed> {
                #[allow(unused_imports)]
                use $crate::Claim as _;
                self.$f.claim_paced_unchecked(req).await
            }
        }
    };
    (@Complete $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Complete for $ty {
            async fn settle_many_unchecked(
                &self,
                settles: Vec<$crate::Settle>,
            ) -> $crate::Result<Vec<$crate::Result<$crate::Settled>>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.settle_many_unchecked(settles).await
            }
            fn preferred_settle_batch(&self) -> usize {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.preferred_settle_batch()
            }
            async fn heartbeat_unchecked(
                &self,
                lease: &$crate::Lease,
                extend: ::std::time::Duration,
            ) -> $crate::Result<$crate::__private::DateTime<$crate::__private::Utc>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.heartbeat_unchecked(lease, extend).await
            }
            async fn worker_beat_unchecked(&self, queue: &str, beat: &$crate::WorkerBeat) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.worker_beat_unchecked(queue, beat).await
            }
            async fn lost_leases_unchecked(
                &self,
                leases: &[$crate::Lease],
            ) -> $crate::Result<Vec<$crate::JobId>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.lost_leases_unchecked(leases).await
            }
            async fn report_progress_unchecked(
                &self,
                reports: &[$crate::ProgressReport],
            ) -> $crate::Result<Vec<$crate::JobId>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.report_progress_unchecked(reports).await
            }
        }
    };
    (@OrderBarrier $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::OrderBarrier for $ty {
            async fn open_batch_unchecked(
                &self,
                batch: &$crate::NewBatch,
            ) -> $crate::Result<$crate::Batch> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.open_batch_unchecked(batch).await
            }
            async fn seal_unchecked(&self, batch: &$crate::Batch) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.seal_unchecked(batch).await
            }
            async fn batch_progress_unchecked(&self, batch: &$crate::Batch) -> $crate::Result<$crate::BatchProgress> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.batch_progress_unchecked(batch).await
            }
            async fn reached_unchecked(&self, batch: &$crate::Batch, target: $crate::WaitFor) -> $crate::Result<bool> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.reached_unchecked(batch, target).await
            }
        }
    };
    (@Inspect $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Inspect for $ty {
            async fn queue_stats_unchecked(&self, queue: &str) -> $crate::Result<$crate::QueueStats> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.queue_stats_unchecked(queue).await
            }
            async fn key_limits_unchecked(&self, queue: &str) -> $crate::Result<$crate::KeyLimits> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.key_limits_unchecked(queue).await
            }
            async fn job_unchecked(&self, queue: &str, id: $crate::JobId) -> $crate::Result<$crate::JobInfo> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.job_unchecked(queue, id).await
            }
            async fn running_unchecked(&self, queue: &str) -> $crate::Result<Vec<$crate::RunningJob>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.running_unchecked(queue).await
            }
            async fn group_holder_unchecked(&self, queue: &str, group: &str) -> $crate::Result<Option<$crate::JobId>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.group_holder_unchecked(queue, group).await
            }
            async fn batches_unchecked(&self, queue: &str, limit: u32) -> $crate::Result<Vec<$crate::BatchProgress>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.batches_unchecked(queue, limit).await
            }
            async fn workers_unchecked(&self, queue: &str) -> $crate::Result<Vec<$crate::WorkerSeen>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.workers_unchecked(queue).await
            }
            async fn batch_jobs_unchecked(
                &self,
                batch: &$crate::Batch,
                after: Option<$crate::JobId>,
                limit: u32,
            ) -> $crate::Result<Vec<$crate::JobId>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.batch_jobs_unchecked(batch, after, limit).await
            }
            async fn list_jobs_unchecked(
                &self,
                queue: &str,
                filter: &$crate::JobFilter,
                before: Option<$crate::JobId>,
                limit: u32,
            ) -> $crate::Result<$crate::JobPage> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.list_jobs_unchecked(queue, filter, before, limit).await
            }
            async fn dead_jobs_unchecked(&self, queue: &str, limit: u32) -> $crate::Result<Vec<$crate::JobInfo>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.dead_jobs_unchecked(queue, limit).await
            }
            async fn queues(&self) -> $crate::Result<Vec<String>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.queues().await
            }
        }
    };
    (@Admin $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Admin for $ty {
            async fn update_queue_unchecked(&self, queue: &str, update: $crate::QueueUpdate) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.update_queue_unchecked(queue, update).await
            }
            async fn set_key_limit_unchecked(&self, queue: &str, key: Option<&str>, limit: Option<u32>) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.set_key_limit_unchecked(queue, key, limit).await
            }
            async fn set_key_rate_unchecked(&self, queue: &str, key: Option<&str>, rate: Option<$crate::Rate>) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.set_key_rate_unchecked(queue, key, rate).await
            }
            async fn cancel_job_unchecked(&self, queue: &str, id: $crate::JobId) -> $crate::Result<bool> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.cancel_job_unchecked(queue, id).await
            }
            async fn cancel_batch_unchecked(&self, batch: &$crate::Batch) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.cancel_batch_unchecked(batch).await
            }
            async fn purge_unchecked(&self, queue: &str) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.purge_unchecked(queue).await
            }
            async fn run_now_unchecked(&self, queue: &str, ids: &[$crate::JobId]) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.run_now_unchecked(queue, ids).await
            }
            async fn delete_jobs_unchecked(&self, queue: &str, ids: &[$crate::JobId]) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.delete_jobs_unchecked(queue, ids).await
            }
            async fn retry_dead_unchecked(&self, queue: &str, ids: Option<&[$crate::JobId]>) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.retry_dead_unchecked(queue, ids).await
            }
            async fn maintain_unchecked(
                &self,
                queue: &str,
                retention: ::std::time::Duration,
            ) -> $crate::Result<$crate::Maintenance> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.maintain_unchecked(queue, retention).await
            }
            async fn try_maintain_unchecked(
                &self,
                queue: &str,
                retention: ::std::time::Duration,
            ) -> $crate::Result<Option<$crate::Maintenance>> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.try_maintain_unchecked(queue, retention).await
            }
        }
    };
    (@Schedules $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Schedules for $ty {
            async fn put_schedule_unchecked(
                &self,
                queue: &str,
                name: &str,
                definition: &str,
                starting: Option<$crate::__private::DateTime<$crate::__private::Utc>>,
            ) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Schedules as _;
                self.$f.put_schedule_unchecked(queue, name, definition, starting).await
            }
            async fn stored_schedules_unchecked(
                &self,
                queue: &str,
            ) -> $crate::Result<(
                Vec<$crate::schedule::StoredSchedule>,
                $crate::__private::DateTime<$crate::__private::Utc>,
            )> {
                #[allow(unused_imports)]
                use $crate::Schedules as _;
                self.$f.stored_schedules_unchecked(queue).await
            }
            async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> $crate::Result<bool> {
                #[allow(unused_imports)]
                use $crate::Schedules as _;
                self.$f.delete_schedule_unchecked(queue, name).await
            }
            async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Schedules as _;
                self.$f.pause_schedule_unchecked(queue, name, paused).await
            }
            async fn fire_unchecked(&self, fire: $crate::schedule::Fire) -> $crate::Result<$crate::schedule::Fired> {
                #[allow(unused_imports)]
                use $crate::Schedules as _;
                self.$f.fire_unchecked(fire).await
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use crate::{
        Backend, Complete, Lease, Result, Settle, Settled, async_trait, memory::MemoryBackend,
    };

    /// Prefers settle calls of 7: an override the outer wrapper must pass on.
    struct Seven(MemoryBackend);

    crate::delegate!(Seven, 0 => Events, Enqueue, Claim, OrderBarrier, Inspect, Admin, Schedules);

    #[async_trait]
    impl Complete for Seven {
        async fn settle_many_unchecked(
            &self,
            settles: Vec<Settle>,
        ) -> Result<Vec<Result<Settled>>> {
            self.0.settle_many_unchecked(settles).await
        }
        fn preferred_settle_batch(&self) -> usize {
            7
        }
        async fn heartbeat_unchecked(
            &self,
            lease: &Lease,
            extend: Duration,
        ) -> Result<chrono::DateTime<chrono::Utc>> {
            self.0.heartbeat_unchecked(lease, extend).await
        }
        async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<crate::JobId>> {
            self.0.lost_leases_unchecked(leases).await
        }
        async fn worker_beat_unchecked(&self, queue: &str, beat: &crate::WorkerBeat) -> Result<()> {
            self.0.worker_beat_unchecked(queue, beat).await
        }
        async fn report_progress_unchecked(
            &self,
            reports: &[crate::ProgressReport],
        ) -> Result<Vec<crate::JobId>> {
            self.0.report_progress_unchecked(reports).await
        }
    }

    struct Outer {
        inner: Arc<dyn Backend>,
    }

    crate::delegate!(Outer, inner => Events, Enqueue, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

    #[tokio::test]
    async fn every_call_and_override_reaches_the_wrapped_backend() {
        let outer = Outer {
            inner: Arc::new(Seven(MemoryBackend::new())),
        };
        assert_eq!(outer.preferred_settle_batch(), 7);
        let b: &dyn Backend = &outer;
        let id = crate::EnqueueExt::enqueue_one(b, crate::NewJob::new("q", vec![]))
            .await
            .unwrap()
            .id;
        assert_eq!(b.job("q", id).await.unwrap().state, crate::JobState::Ready);
        assert_eq!(b.queues().await.unwrap(), ["q"]);
    }

    /// Counts the enqueues that reach it.
    struct Counting {
        inner: MemoryBackend,
        calls: std::sync::atomic::AtomicU32,
    }

    crate::delegate!(Counting, inner => Events, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

    #[async_trait]
    impl crate::Enqueue for Counting {
        async fn enqueue_unchecked(
            &self,
            jobs: Vec<crate::NewJob>,
        ) -> Result<Vec<crate::Enqueued>> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.enqueue_unchecked(jobs).await
        }
    }

    #[tokio::test]
    async fn bad_input_is_refused_before_the_backend_and_good_input_reaches_it_once() {
        let counting = Arc::new(Counting {
            inner: MemoryBackend::new(),
            calls: std::sync::atomic::AtomicU32::new(0),
        });
        let outer = Outer {
            inner: counting.clone(),
        };
        let b: &dyn Backend = &outer;
        let bad = b.enqueue(vec![crate::NewJob::new("a queue", vec![])]).await;
        assert_eq!(bad.unwrap_err().invalid_field(), Some("queue"));
        let calls = || counting.calls.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(calls(), 0, "bad input reached the backend");
        b.enqueue(vec![crate::NewJob::new("q", vec![])])
            .await
            .unwrap();
        assert_eq!(calls(), 1);
    }
}
