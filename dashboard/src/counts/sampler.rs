//! Keeps the charts' samples coming for every queue in use while the dashboard runs,
//! not only for the queues a page happens to poll: every [`EVERY`] it asks for the
//! counts of the configured queues and of the queues in use (at most
//! [`MAX_LISTED`](crate::api::MAX_LISTED) of those). The counts' own rules decide what
//! is counted again, so a slow queue is still counted no more often than they allow.

use std::sync::Weak;

use super::history::EVERY;
use crate::state::Inner;

/// Counts asked for at once.
const AT_ONCE: usize = 8;
/// The longest the sampler waits for a few counts before it asks for the next few.
const CHUNK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs until the dashboard it samples for is dropped. The first pass is at once.
pub(crate) async fn run(state: Weak<Inner>) {
    let every = EVERY.to_std().unwrap_or(std::time::Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let mut queues = state.options.queues.clone();
        // A backend that cannot list its queues now still has the configured ones
        // sampled; the pages say what went wrong.
        if let Ok(in_use) = state.backend.queues().await {
            for name in in_use.into_iter().take(crate::api::MAX_LISTED) {
                if !queues.contains(&name) {
                    queues.push(name);
                }
            }
        }
        // A few queues at a time, each few counted before the next start: a pass over
        // 200 queues must not put 200 counts on the backend's pool at once. A count
        // that outlasts the wait goes on alone; its queue is not counted again until
        // it ends.
        for some in queues.chunks(AT_ONCE) {
            state.counts.count_due(some, CHUNK_WAIT).await;
        }
    }
}
