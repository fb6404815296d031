//! Wake-up hints a backend can send (SPEC W2, B5).

use std::sync::Arc;

/// What happened in a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Jobs became claimable (enqueue, release).
    Ready,
    /// A job finished (succeeded, dead or cancelled).
    Finished,
    /// A running job of the queue may have lost its lease to a cancel (SPEC B7):
    /// workers holding leases in the queue check them at once
    /// ([`Complete::lost_leases`](crate::Complete::lost_leases)).
    Revoked,
    /// Events may have been lost (say, the backend's notification connection dropped
    /// and was re-established): every listener should re-check every queue once.
    Resync,
}

/// A wake-up hint for one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The queue concerned.
    pub queue: Arc<str>,
    /// What happened.
    pub kind: EventKind,
}

impl Event {
    /// Whether a listener interested in `kind` events of `queue` should wake:
    /// a matching event, or a [`EventKind::Resync`].
    #[must_use]
    pub fn concerns(&self, queue: &str, kind: EventKind) -> bool {
        self.kind == EventKind::Resync || (self.kind == kind && *self.queue == *queue)
    }
}

/// The wake-up channel a backend shares among its handles: [`notify`](Self::notify)
/// on changes, [`subscribe`](Self::subscribe) for [`Events::subscribe`](crate::Events).
#[derive(Debug, Clone)]
pub struct EventBus(tokio::sync::broadcast::Sender<Event>);

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// A bus keeping up to 1024 unread events per subscriber; slower ones see a lag,
    /// which callers treat as a wake-up.
    #[must_use]
    pub fn new() -> Self {
        Self(tokio::sync::broadcast::channel(1024).0)
    }

    /// Sends `kind` for `queue`; nobody listening is fine, events are only hints.
    pub fn notify(&self, queue: &str, kind: EventKind) {
        let _ = self.0.send(Event {
            queue: Arc::from(queue),
            kind,
        });
    }

    /// Tells every listener that events may have been lost, so each re-checks once.
    pub fn resync(&self) {
        let _ = self.0.send(Event {
            queue: Arc::from("*"),
            kind: EventKind::Resync,
        });
    }

    /// A new receiver of every later event.
    #[must_use]
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resync_concerns_every_listener() {
        let ready = Event {
            queue: Arc::from("a"),
            kind: EventKind::Ready,
        };
        assert!(ready.concerns("a", EventKind::Ready));
        assert!(!ready.concerns("b", EventKind::Ready));
        assert!(!ready.concerns("a", EventKind::Finished));
        let bus = EventBus::new();
        let mut rx = bus.subscribe();
        bus.resync();
        let ev = rx.try_recv().unwrap();
        assert!(ev.concerns("a", EventKind::Finished));
        assert!(ev.concerns("any.queue", EventKind::Ready));
    }
}
