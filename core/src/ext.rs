//! Conveniences over the backend traits: each is written once, here, in terms of the
//! trait's own methods, and no backend overrides it (as `object_store`'s
//! `ObjectStoreExt`). Blanket-implemented, so every backend and `dyn Backend` has them;
//! bring them into scope with `relayq::prelude::*` or by name.

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Batch, BatchProgress, Complete, Enqueue, Enqueued, Error, Lease, NewJob, OrderBarrier, Result,
    Retry, Settle, Settled, WaitFor,
};

/// One-job forms of [`Enqueue`].
#[async_trait]
pub trait EnqueueExt: Enqueue {
    /// Stores one job; see [`Enqueue::enqueue`].
    async fn enqueue_one(&self, job: NewJob) -> Result<Enqueued> {
        let mut out = self.enqueue(vec![job]).await?;
        out.pop()
            .ok_or_else(|| Error::backend("enqueue returned no id for one job"))
    }
}

impl<T: Enqueue + ?Sized> EnqueueExt for T {}

/// One-lease forms of [`Complete::settle_many`].
#[async_trait]
pub trait CompleteExt: Complete {
    /// Marks the job `succeeded`.
    ///
    /// # Behavior
    /// - Succeeds only while the job is `running` under this exact token; otherwise
    ///   [`Error::StaleLease`] and nothing changes. A second complete of the same lease
    ///   is `StaleLease` (SPEC L1).
    /// - A lease past its expiry no longer holds, even before another claimer takes the
    ///   job over: validity is judged by server time alone, the same on every backend
    ///   (SPEC C2, C5). Workers keep leases alive with [`heartbeat`](Self::heartbeat).
    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.settle_one(Settle::complete(lease.clone()))
            .await
            .map(|_| ())
    }

    /// Records a failed attempt.
    ///
    /// # Behavior
    /// - With attempts left and `retry` not [`Retry::Never`], the job becomes `retrying`
    ///   until server now + the retry delay, then claimable again; otherwise it becomes
    ///   `dead`. The error text is kept (SPEC L2).
    /// - A stale token is [`Error::StaleLease`] and nothing changes (SPEC L1).
    async fn fail(&self, lease: &Lease, error: &str, retry: Retry) -> Result<Settled> {
        self.settle_one(Settle::fail(lease.clone(), error, retry))
            .await
    }

    /// Gives the job back: `ready` again, the attempt not counted (SPEC L4).
    ///
    /// # Behavior
    /// - The next claim of the job gets the same attempt number again (SPEC L4).
    /// - A stale token is [`Error::StaleLease`] and nothing changes (SPEC L1).
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.settle_one(Settle::release(lease.clone()))
            .await
            .map(|_| ())
    }

    /// Settles one lease through [`settle_many`](Self::settle_many).
    async fn settle_one(&self, settle: Settle) -> Result<Settled> {
        self.settle_many(vec![settle])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::backend("settle_many returned no result")))
    }
}

impl<T: Complete + ?Sized> CompleteExt for T {}

/// Waiting on a batch through [`OrderBarrier::reached`].
#[async_trait]
pub trait OrderBarrierExt: OrderBarrier {
    /// Waits until `target` is reached or `timeout` passes (SPEC B5).
    ///
    /// # Behavior
    /// - Returns the progress once the stage (and every stage below it) is finished, or
    ///   once the sealed batch is finished (SPEC B5).
    /// - After `timeout`, [`Error::Timeout`] (SPEC B5).
    /// - Polls the server no faster than every 100 ms, and wakes on the backend's
    ///   `Finished` events where it has them (SPEC B5).
    /// - Checks with [`reached`](Self::reached), and reads the counts only once it says
    ///   yes: waiting on a large batch does not count it again and again.
    async fn wait(
        &self,
        batch: &Batch,
        target: WaitFor,
        timeout: Duration,
    ) -> Result<BatchProgress> {
        crate::wait_polling(self, batch, target, timeout).await
    }
}

impl<T: OrderBarrier + ?Sized> OrderBarrierExt for T {}
