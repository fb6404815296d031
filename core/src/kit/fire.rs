//! The judgement of a fire (SPEC S2), for backends that read the schedule's row and
//! decide in Rust: one place for the order of the checks.

use chrono::{DateTime, Utc};

use crate::schedule::{Fire, Fired};

/// Why `fire` must not go on, given the schedule's stored `version`, `mark` and
/// `paused` flag and the server's `now`, read under the row's lock; `None` to go on.
///
/// A version other than the one asked is [`Fired::Changed`], whatever the slot; "run
/// now" (no slot) then goes on. A slot is refused when the schedule is paused
/// ([`Fired::Paused`]), when the mark is at or past it ([`Fired::Taken`]) and when it
/// lies after `now` ([`Fired::NotDue`]).
#[must_use]
pub fn refusal(
    fire: &Fire,
    version: i64,
    mark: DateTime<Utc>,
    paused: bool,
    now: DateTime<Utc>,
) -> Option<Fired> {
    if version != fire.version {
        return Some(Fired::Changed);
    }
    let slot = fire.slot?;
    if paused {
        Some(Fired::Paused)
    } else if mark >= slot {
        Some(Fired::Taken)
    } else if slot > now {
        Some(Fired::NotDue)
    } else {
        None
    }
}
