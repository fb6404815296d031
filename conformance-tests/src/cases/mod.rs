//! The cases, one module per SPEC section. Each case cites its rule.

pub mod after;
pub mod batches;
pub mod cancel;
pub mod claim;
pub mod cut;
pub mod enqueue;
pub mod errors;
pub mod events;
pub mod groups;
pub mod key_rates;
pub mod keys;
pub mod lease;
pub mod listing;
pub mod monitor;
pub mod progress;
pub mod purge;
pub mod rates;
pub mod scenarios;
pub mod schedules;
pub mod support;
pub mod workers;
