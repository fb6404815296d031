//! # relayq
//!
//! A job queue for ordered parallel work, with pluggable backends: the one crate to
//! depend on. [`connect`] opens the backend a URL names; [`prelude`] brings the traits
//! and types into scope; everything of [`relayq_core`] is re-exported here.
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `sqlite://relayq.db` | SQLite, embedded | `sqlite` (default) |
//! | `postgres://user@host/db` | PostgreSQL | `postgres` |
//! | `redis://host:6379` | Redis | `redis` |
//! | `redis-cluster://host:7000,host:7001,host:7002` | Redis Cluster | `redis` |
//! | `mssql://user:pass@host:1433/db` | SQL Server | `mssql` |
//! | `memory://` | in-memory reference model | always |
//!
//! relayq's own options go in the query and are taken out before the driver sees the
//! URL: `?schema=NAME` and `?max_connections=N` for PostgreSQL and SQL Server (the
//! tables' schema, default `relayq`; the pool's size), `?prefix=P` for Redis (every
//! key's prefix, default `relayq`). Other options go to the driver as written
//! (`sslmode`, Redis's `allow_eviction`).
//!
//! ```
//! use relayq::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> relayq::Result<()> {
//! let backend = relayq::connect("memory://").await?;
//! backend.enqueue_one(NewJob::new("mail", b"hello".to_vec())).await?;
//! let stats = backend.queue_stats("mail").await?;
//! assert_eq!(stats.count(JobState::Ready), 1);
//! # Ok(())
//! # }
//! ```
//!
//! The behaviour every backend promises is the contract in `docs/SPEC.md` of the
//! repository.

mod connect;
pub mod prelude;

pub use chrono;
pub use connect::{Migrate, connect, connect_with, driver_for, drivers, register, schemes};
pub use relayq_core::*;
#[cfg(feature = "mssql")]
pub use relayq_mssql as mssql;
#[cfg(feature = "postgres")]
pub use relayq_postgres as postgres;
#[cfg(feature = "redis")]
pub use relayq_redis as redis;
#[cfg(feature = "sqlite")]
pub use relayq_sqlite as sqlite;

/// The README's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
