//! The memory backend's "server clock", injectable so unit tests control time.

use std::{
    fmt::Debug,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};

/// A source of "server time" for the memory backend.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    #[must_use]
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now += TimeDelta::from_std(by).expect("advance fits a TimeDelta");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
