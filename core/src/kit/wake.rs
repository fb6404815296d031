//! Wake-up messages between processes, as every backend with a notification channel
//! sends them (SPEC W2, B5, B7): `r:<queue>` (jobs became claimable), `f:<queue>` (jobs
//! finished) and `c:<queue>` (running jobs may have been cancelled), and the one task
//! per backend handle that listens for them.
//!
//! Messages are hints: a lost one costs a waiter at most a poll interval, never a job.
//! A listener that reconnects calls [`EventBus::resync`] so every waiter checks once.

use std::{future::Future, sync::OnceLock};

use tokio_util::task::AbortOnDropHandle;

use crate::{EventBus, EventKind};

/// Prefix of a message that jobs became claimable.
pub const READY: &str = "r";
/// Prefix of a message that jobs finished.
pub const FINISHED: &str = "f";
/// Prefix of a message that running jobs may have lost their leases to a cancel.
pub const REVOKED: &str = "c";

/// Passes one message on to `events`; anything else is logged and dropped.
pub fn forward(events: &EventBus, message: &str) {
    match message.split_once(':') {
        Some((READY, queue)) => events.notify(queue, EventKind::Ready),
        Some((FINISHED, queue)) => events.notify(queue, EventKind::Finished),
        Some((REVOKED, queue)) => events.notify(queue, EventKind::Revoked),
        _ => tracing::debug!(message, "ignoring an unknown relayq wake-up message"),
    }
}

/// The message telling listeners that running jobs of `queue` may have been cancelled.
#[must_use]
pub fn revoked(queue: &str) -> String {
    format!("{REVOKED}:{queue}")
}

/// The messages telling listeners about `ready` and `finished` queues: each queue once
/// per kind, sorted.
pub fn messages<'a>(
    ready: impl IntoIterator<Item = &'a str>,
    finished: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let mut out: Vec<String> = ready
        .into_iter()
        .map(|q| format!("{READY}:{q}"))
        .chain(finished.into_iter().map(|q| format!("{FINISHED}:{q}")))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The listening task of one backend handle: started once, by the first subscriber,
/// and stopped when the handle is dropped.
#[derive(Debug, Default)]
pub struct ListenTask(OnceLock<Option<AbortOnDropHandle<()>>>);

impl ListenTask {
    /// Spawns the future `listen` makes, the first time only, if a tokio runtime is
    /// running (without one, callers poll).
    pub fn start<F>(&self, listen: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.0.get_or_init(|| {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            Some(AbortOnDropHandle::new(handle.spawn(listen())))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_each_queue_once_per_kind() {
        assert_eq!(
            messages(["b", "a", "b"], ["a"]),
            ["f:a", "r:a", "r:b"].map(String::from)
        );
    }

    #[tokio::test]
    async fn forwarded_messages_reach_the_queue_s_waiters() {
        let events = EventBus::default();
        let mut rx = events.subscribe();
        forward(&events, "r:mail");
        forward(&events, "nonsense");
        forward(&events, "f:mail");
        forward(&events, &revoked("mail"));
        let first = rx.recv().await.unwrap();
        assert_eq!((&*first.queue, first.kind), ("mail", EventKind::Ready));
        let second = rx.recv().await.unwrap();
        assert_eq!((&*second.queue, second.kind), ("mail", EventKind::Finished));
        let third = rx.recv().await.unwrap();
        assert_eq!((&*third.queue, third.kind), ("mail", EventKind::Revoked));
    }
}
