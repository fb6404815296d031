//! # relayq-torture
//!
//! Fault runs against the `relayq` binary, Jepsen-style: each run starts its own
//! server (PostgreSQL, Redis, a 3-node Redis Cluster) or SQLite file in a temporary
//! folder, enqueues a seeded mix of jobs (half of them while the workers run), runs
//! `relayq work` processes and a library worker, injects a seeded schedule of faults,
//! and checks what ran (a ledger the jobs' commands append to) against what the
//! database says. See `docs/RELIABILITY.md` of the repository.

pub mod check;
pub mod feed;
pub mod key_rates;
pub mod keys;
pub mod ledger;
pub mod plan;
pub mod rates;
pub mod report;
pub mod run;
pub mod servers;
pub mod slots;
pub mod soak;
pub mod stops;
pub mod workers;
