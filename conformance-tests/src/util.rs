//! Small helpers every case uses.

use std::{future::Future, time::Duration};

use tokio::time::{Instant, sleep};

/// A fresh queue name, unique per call: `t.<tag>.<random>`.
#[must_use]
pub fn queue_name(tag: &str) -> String {
    format!("t.{tag}.{}", uuid::Uuid::new_v4().simple())
}

/// Polls `check` every 20 ms until it returns `Some`, or fails after `within`.
///
/// # Errors
/// When `within` passes first, or `check` fails.
pub async fn poll_until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {within:?} waiting for {what}");
        }
        sleep(Duration::from_millis(20)).await;
    }
}
