//! [`delegate!`](crate::delegate): a wrapper's trait impls that pass every call to the
//! backend it wraps, for wrappers that change one or two methods (a timer around
//! claims, faults injected into settles) and must not lose the others' overrides
//! (`reached`, `try_maintain`, `preferred_settle_batch`) by writing them out by hand.

/// Implements the named backend traits for a wrapper by passing each method, overrides
/// included, to one of its fields (an `Arc<dyn Backend>`, an `Arc<B>` or a `B`); the
/// wrapper writes the traits it changes itself.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
/// use relayq_core::{async_trait, Backend, Claim, ClaimRequest, ClaimedJob, Result};
///
/// /// Counts claims; everything else is the inner backend's.
/// struct Counted {
///     inner: Arc<dyn Backend>,
///     claims: AtomicU64,
/// }
///
/// relayq_core::delegate!(Counted, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin);
///
/// #[async_trait]
/// impl Claim for Counted {
///     async fn claim(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim(req).await
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
        }
    };
    (@Enqueue $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Enqueue for $ty {
            async fn enqueue(&self, jobs: Vec<$crate::NewJob>) -> $crate::Result<Vec<$crate::Enqueued>> {
                #[allow(unused_imports)]
                use $crate::Enqueue as _;
                self.$f.enqueue(jobs).await
            }
        }
    };
    (@Claim $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Claim for $ty {
            async fn claim(&self, req: $crate::ClaimRequest) -> $crate::Result<Vec<$crate::ClaimedJob>> {
                #[allow(unused_imports)]
                use $crate::Claim as _;
                self.$f.claim(req).await
            }
        }
    };
    (@Complete $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Complete for $ty {
            async fn settle_many(
                &self,
                settles: Vec<$crate::Settle>,
            ) -> $crate::Result<Vec<$crate::Result<$crate::Settled>>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.settle_many(settles).await
            }
            fn preferred_settle_batch(&self) -> usize {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.preferred_settle_batch()
            }
            async fn heartbeat(
                &self,
                lease: &$crate::Lease,
                extend: ::std::time::Duration,
            ) -> $crate::Result<$crate::__private::DateTime<$crate::__private::Utc>> {
                #[allow(unused_imports)]
                use $crate::Complete as _;
                self.$f.heartbeat(lease, extend).await
            }
        }
    };
    (@OrderBarrier $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::OrderBarrier for $ty {
            async fn open_batch(
                &self,
                queue: &str,
                on_failure: $crate::OnFailure,
            ) -> $crate::Result<$crate::Batch> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.open_batch(queue, on_failure).await
            }
            async fn seal(&self, batch: &$crate::Batch) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.seal(batch).await
            }
            async fn batch_progress(&self, batch: &$crate::Batch) -> $crate::Result<$crate::BatchProgress> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.batch_progress(batch).await
            }
            async fn reached(&self, batch: &$crate::Batch, target: $crate::WaitFor) -> $crate::Result<bool> {
                #[allow(unused_imports)]
                use $crate::OrderBarrier as _;
                self.$f.reached(batch, target).await
            }
        }
    };
    (@Inspect $ty:ty, $f:tt) => {
        #[$crate::async_trait]
        impl $crate::Inspect for $ty {
            async fn queue_stats(&self, queue: &str) -> $crate::Result<$crate::QueueStats> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.queue_stats(queue).await
            }
            async fn job(&self, queue: &str, id: $crate::JobId) -> $crate::Result<$crate::JobInfo> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.job(queue, id).await
            }
            async fn running(&self, queue: &str) -> $crate::Result<Vec<$crate::RunningJob>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.running(queue).await
            }
            async fn batches(&self, queue: &str, limit: u32) -> $crate::Result<Vec<$crate::BatchProgress>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.batches(queue, limit).await
            }
            async fn batch_jobs(
                &self,
                batch: &$crate::Batch,
                after: Option<$crate::JobId>,
                limit: u32,
            ) -> $crate::Result<Vec<$crate::JobId>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.batch_jobs(batch, after, limit).await
            }
            async fn dead_jobs(&self, queue: &str, limit: u32) -> $crate::Result<Vec<$crate::JobInfo>> {
                #[allow(unused_imports)]
                use $crate::Inspect as _;
                self.$f.dead_jobs(queue, limit).await
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
            async fn pause(&self, queue: &str) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.pause(queue).await
            }
            async fn resume(&self, queue: &str) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.resume(queue).await
            }
            async fn set_max_running(&self, queue: &str, max_running: Option<u32>) -> $crate::Result<()> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.set_max_running(queue, max_running).await
            }
            async fn cancel_job(&self, queue: &str, id: $crate::JobId) -> $crate::Result<bool> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.cancel_job(queue, id).await
            }
            async fn cancel_batch(&self, batch: &$crate::Batch) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.cancel_batch(batch).await
            }
            async fn retry_dead(&self, queue: &str, ids: Option<&[$crate::JobId]>) -> $crate::Result<u64> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.retry_dead(queue, ids).await
            }
            async fn maintain(
                &self,
                queue: &str,
                retention: ::std::time::Duration,
            ) -> $crate::Result<$crate::Maintenance> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.maintain(queue, retention).await
            }
            async fn try_maintain(
                &self,
                queue: &str,
                retention: ::std::time::Duration,
            ) -> $crate::Result<Option<$crate::Maintenance>> {
                #[allow(unused_imports)]
                use $crate::Admin as _;
                self.$f.try_maintain(queue, retention).await
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

    crate::delegate!(Seven, 0 => Events, Enqueue, Claim, OrderBarrier, Inspect, Admin);

    #[async_trait]
    impl Complete for Seven {
        async fn settle_many(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
            self.0.settle_many(settles).await
        }
        fn preferred_settle_batch(&self) -> usize {
            7
        }
        async fn heartbeat(
            &self,
            lease: &Lease,
            extend: Duration,
        ) -> Result<chrono::DateTime<chrono::Utc>> {
            self.0.heartbeat(lease, extend).await
        }
    }

    struct Outer {
        inner: Arc<dyn Backend>,
    }

    crate::delegate!(Outer, inner => Events, Enqueue, Claim, Complete, OrderBarrier, Inspect, Admin);

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
}
