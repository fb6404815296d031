//! SPEC E — enqueue.

use anyhow::ensure;
use relayq_core::NewJob;

use crate::{Env, queue_name};

/// SPEC E1: ids come back in input order, increasing.
pub async fn e1_returns_ids_in_order(env: &Env) -> anyhow::Result<()> {
    let q = queue_name("e1");
    let jobs = (0..5).map(|i| NewJob::new(&q, vec![i])).collect();
    let out = env.backend().enqueue(jobs).await?;
    ensure!(out.len() == 5, "expected 5 ids, got {}", out.len());
    ensure!(out.windows(2).all(|w| w[0].id < w[1].id), "ids not increasing: {out:?}");
    ensure!(out.iter().all(|e| !e.deduplicated));
    Ok(())
}
