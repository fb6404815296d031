//! Reading the items a listing named, for backends whose listing query returns ids
//! ([`Inspect::batches`], [`Inspect::dead_jobs`]).

use crate::{Batch, BatchId, BatchProgress, Error, Inspect, JobId, JobInfo, Result};

/// The progress of each batch of `queue` in `ids`, in that order. A batch pruned
/// between the listing and this read is left out rather than failing the whole list.
///
/// # Errors
/// The first error of [`batch_progress`](crate::OrderBarrier::batch_progress) other than
/// [`Error::NotFound`].
pub async fn batches<B: Inspect + crate::OrderBarrier + ?Sized>(
    backend: &B,
    queue: &str,
    ids: impl IntoIterator<Item = i64>,
) -> Result<Vec<BatchProgress>> {
    let mut out = Vec::new();
    for id in ids {
        let batch = Batch {
            queue: queue.to_owned(),
            id: BatchId(id),
        };
        match backend.batch_progress(&batch).await {
            Ok(p) => out.push(p),
            Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Each job of `queue` in `ids`, in that order, leaving out jobs pruned between the
/// listing and this read.
///
/// # Errors
/// The first error of [`Inspect::job`] other than [`Error::NotFound`].
pub async fn jobs<B: Inspect + ?Sized>(
    backend: &B,
    queue: &str,
    ids: impl IntoIterator<Item = i64>,
) -> Result<Vec<JobInfo>> {
    let mut out = Vec::new();
    for id in ids {
        match backend.job(queue, JobId(id)).await {
            Ok(j) => out.push(j),
            Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EnqueueExt, NewJob, OnFailure, OrderBarrier, memory::MemoryBackend};

    /// SPEC M1, M2: an id that no longer exists (pruned after it was listed) is left
    /// out; the others come back in the listed order.
    #[tokio::test]
    async fn vanished_ids_are_left_out() {
        let b = MemoryBackend::new();
        let a = b.enqueue_one(NewJob::new("q", vec![])).await.unwrap().id.0;
        let c = b.enqueue_one(NewJob::new("q", vec![])).await.unwrap().id.0;
        let got = jobs(&b, "q", [c, 999_999, a]).await.unwrap();
        assert_eq!(got.iter().map(|j| j.id.0).collect::<Vec<_>>(), [c, a]);
        let batch = b.open_batch("q", OnFailure::Continue).await.unwrap();
        let got = batches(&b, "q", [999_999, batch.id.0]).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].batch, batch);
        assert!(matches!(
            jobs(&b, "bad name!", [a]).await,
            Err(Error::InvalidInput { .. })
        ));
    }
}
