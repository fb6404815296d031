//! A purge in steps (SPEC B9), as a backend with short transactions runs it.

use crate::{Batch, BatchId, Result};

/// Cancels `queue`'s batches that had unfinished jobs when the purge began, each whole
/// with `cancel_batch` (highest stage first, so no later stage is released), then runs
/// `step` until it says nothing is left; returns how many jobs were cancelled.
///
/// `step` cancels the next few unfinished jobs of no batch, last in claim order first,
/// and returns how many, or `None` once none is left. Each step is a transaction of
/// its own, so no purge holds many locks for long.
///
/// # Errors
/// The first error of `cancel_batch` or `step`; what was cancelled before stays so.
pub async fn purge<F, FFut, S, SFut>(
    queue: &str,
    batches: Vec<i64>,
    mut cancel_batch: F,
    mut step: S,
) -> Result<u64>
where
    F: FnMut(Batch) -> FFut,
    FFut: Future<Output = Result<u64>>,
    S: FnMut() -> SFut,
    SFut: Future<Output = Result<Option<u64>>>,
{
    let mut n = 0;
    for id in batches {
        n += cancel_batch(Batch {
            queue: queue.to_owned(),
            id: BatchId(id),
        })
        .await?;
    }
    while let Some(cancelled) = step().await? {
        n += cancelled;
    }
    Ok(n)
}
