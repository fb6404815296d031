//! Wake-up hints a backend can send (SPEC W2, B5).

use std::sync::Arc;

/// What happened in a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Jobs became claimable (enqueue, release).
    Ready,
    /// A job finished (succeeded, dead or cancelled).
    Finished,
}

/// A wake-up hint for one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The queue concerned.
    pub queue: Arc<str>,
    /// What happened.
    pub kind: EventKind,
}
