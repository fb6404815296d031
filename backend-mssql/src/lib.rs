//! # relayq-mssql
//!
//! The SQL Server backend of [relayq](https://docs.rs/relayq-core), on
//! [tiberius](https://docs.rs/tiberius) 0.13 with a small bb8 pool.
//!
//! - **Claims** are one `UPDATE` through a CTE that reads the earliest claimable jobs
//!   `WITH (ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK)` over a filtered index
//!   matching its `WHERE` and `ORDER BY`: claimers skip each other's rows instead of
//!   waiting, with `READ_COMMITTED_SNAPSHOT` on or off, and expired leases are taken
//!   over by the same statement (SPEC C5). The index is pinned
//!   (`INDEX(jobs_claim), FORCESEEK`). A claim takes at most [`MAX_CLAIM`] rows, and
//!   lock escalation is off on the queue tables, so no statement turns its row locks
//!   into a table lock that `READPAST` could not skip.
//! - **One round trip per operation**: each operation is one T-SQL batch that runs its
//!   own short transaction (`XACT_ABORT` on), promotion included, so no lock is held
//!   between round trips and none while a job runs.
//! - **Groups and stages by promotion**, as in the PostgreSQL backend: a job is stored
//!   `blocked` until its group and stage allow it; the transaction that finishes what
//!   it waited for promotes it, serialized per batch (row lock) and per group
//!   (`sp_getapplock`). A batch chosen as deadlock victim (error 1205) runs again,
//!   a bounded number of times, whatever the operation; a connection whose request
//!   failed with a server error and left no transaction open stays in the pool.
//! - **Wake-ups**: SQL Server has no `LISTEN/NOTIFY`. Handles in one process share
//!   events (a job enqueued or released here wakes local workers at once); other
//!   processes are found by the worker's bounded adaptive polling (10 ms after work,
//!   backing off to `poll_max`, 1 s by default), and `wait` polls every 100 ms.
//! - **Timeouts**: every request has a command timeout ([`Config::command_timeout`],
//!   30 s by default, set deliberately rather than inherited): a request that times
//!   out closes its connection, so the server rolls back whatever it had open.
//! - **Schema**: everything lives in one schema (default `relayq`), created by
//!   [`MssqlBackend::migrate`] under an application lock, safe from many processes.
//!
//! Needs SQL Server 2016 or later (`OPENJSON`, database compatibility level 130+).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use relayq_core::{EnqueueExt, NewJob};
//! use relayq_mssql::MssqlBackend;
//!
//! // The server's certificate is validated, against the CA that signed it.
//! let backend = MssqlBackend::connect(
//!     "mssql://app:secret@db.internal:1433/app?trust_cert_ca=/etc/ssl/certs/mssql-ca.pem",
//! )
//! .await?;
//! backend.migrate().await?;
//! backend.enqueue_one(NewJob::new("mail", b"hello".to_vec())).await?;
//! # Ok(()) }
//! ```

mod admin;
mod barrier;
mod claim;
mod conn;
mod driver;
mod enqueue;
mod error;
mod inspect;
mod keys;
mod rows;
mod schedules;
mod schema;
#[cfg(test)]
mod server_tests;
mod settle;
mod sql;
mod workers;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use relayq_core::{
    Error, Event, EventBus, EventKind, Events, Limits, Result, kit::schema as versions,
};
use tiberius::{Row, ToSql};
use tokio::sync::broadcast;

pub use driver::DRIVER;
pub use schema::DEFAULT_SCHEMA;

/// The schema version this crate migrates to; [`MssqlBackend::migrate`] refuses a
/// schema at a newer one (the test suites name their schemas after it).
pub const SCHEMA_VERSION: usize = sql::MIGRATIONS.len();

use crate::{conn::Manager, error::db, schema::Schema};

/// The most rows one claim takes, whatever the request asks: it bounds the claim's
/// transaction and its locks (each claimed row locks its clustered key and its index
/// entries). Lock escalation, which a claim of this size could approach, is off on
/// the queue tables (migration 2, see `sql::MIGRATIONS`).
pub const MAX_CLAIM: u32 = 500;

/// Settings of a [`MssqlBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The schema holding relayq's tables (default `relayq`): 1 to 48 bytes of
    /// `a-z 0-9 _`.
    pub schema: String,
    /// Payload size limit and the like.
    pub limits: Limits,
    /// Pool size (default 10).
    pub max_connections: u32,
    /// How long an operation waits for a pooled connection (default 30 s).
    pub acquire_timeout: Duration,
    /// How long the server may stay silent on one request before it fails with
    /// [`Error::Backend`] and its connection is closed, which rolls back its
    /// transaction (default 30 s; tiberius's own default is the same, set here on
    /// purpose). relayq's statements are short; waiting this long means a lock held
    /// elsewhere, such as a long transaction of the application.
    pub command_timeout: Duration,
    /// A pooled connection idle at least this long is checked with a round trip before
    /// an operation uses it (default 1 s); one used more recently is not, so a claim
    /// is one round trip (bb8 checks every connection by default). Each connection that
    /// dies within this time after its last use fails one operation, the next that
    /// takes it, with [`Error::Backend`], and is then discarded. `Duration::ZERO` checks every connection.
    pub check_after_idle: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            schema: DEFAULT_SCHEMA.to_owned(),
            limits: Limits::default(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(30),
            command_timeout: Duration::from_secs(30),
            check_after_idle: Duration::from_secs(1),
        }
    }
}

impl Config {
    /// The settings with another schema.
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The settings with another pool size.
    #[must_use]
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// The settings with another command timeout.
    #[must_use]
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The settings with another [`check_after_idle`](Self::check_after_idle).
    #[must_use]
    pub fn with_check_after_idle(mut self, idle: Duration) -> Self {
        self.check_after_idle = idle;
        self
    }
}

/// How long [`MssqlBackend::connect_with`]'s first connection may take.
pub const CONNECT_TIMEOUT: std::time::Duration = relayq_core::kit::CONNECT_TIMEOUT;

/// A relayq backend on a SQL Server database. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct MssqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: bb8::Pool<Manager>,
    schema: Schema,
    limits: Limits,
    events: EventBus,
    /// [`sql::migrate_lock_timeout`] of the command timeout.
    migrate_lock_ms: i32,
}

impl std::fmt::Debug for MssqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MssqlBackend")
            .field("schema", &self.inner.schema.name())
            .finish_non_exhaustive()
    }
}

impl MssqlBackend {
    /// Connects with the default [`Config`] to `url`: `mssql://user:password@host:port/
    /// database?trust_cert_ca=/path/to/ca.pem`, an ADO.NET connection string
    /// (`...;TrustServerCertificateCA=/path/to/ca.pem`), or a `jdbc:sqlserver://`
    /// string. Call [`migrate`](Self::migrate) before first use of a new schema.
    ///
    /// The connection is encrypted and the server's certificate validated: against
    /// the system's roots, plus the CA file `trust_cert_ca` names (for a certificate a
    /// private CA signed). `trust_cert=true` accepts any certificate for any host
    /// name, which is no protection against a man in the middle: for a local
    /// container or CI, never production. In the URL form, user, password and option
    /// values are percent-decoded only (`%40` is `@`, and `+` stays `+`); characters
    /// of `@ : / ? # %` in a password must be percent-encoded. Errors never quote
    /// `url`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `url` for a malformed one; [`Error::Backend`] when
    /// the server cannot be reached or refuses the login.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, Config::default()).await
    }

    /// Connects to `url` with `config`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidInput`] on `schema` for a bad
    /// schema name.
    pub async fn connect_with(url: &str, config: Config) -> Result<Self> {
        let schema = schema::schema(&config.schema)?;
        let tds = conn::parse(url, config.command_timeout)?;
        let manager = Manager {
            config: tds,
            check_after_idle: config.check_after_idle,
        };
        // Fail now, not at first use, when the server is not there: one connection,
        // within CONNECT_TIMEOUT, with the driver's own cause. The pool would retry a
        // refused connection until its acquire timeout (30 s) and report only that.
        let first =
            relayq_core::kit::probe("SQL Server", bb8::ManageConnection::connect(&manager), db)
                .await?;
        drop(first);
        let pool = bb8::Pool::builder()
            .max_size(config.max_connections.max(1))
            .connection_timeout(config.acquire_timeout)
            .build(manager)
            .await
            .map_err(db)?;
        let events = shared_events(&format!("{url}\u{1f}{}", config.schema));
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                limits: config.limits,
                events,
                migrate_lock_ms: sql::migrate_lock_timeout(config.command_timeout),
            }),
        })
    }

    /// Creates the schema and its tables, or brings them up to date, in one
    /// transaction under an application lock per schema: safe to run from many
    /// processes at once. A migrator waits for another one's lock for three quarters
    /// of [`Config::command_timeout`] (22.5 s by default), so the server's "timed out
    /// waiting for the migration lock" arrives before the command timeout would.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails, when the lock wait times out, or when
    /// the schema was created by a newer relayq-mssql.
    pub async fn migrate(&self) -> Result<()> {
        let mut conn = self.inner.pool.get().await.map_err(error::pool)?;
        // Left set on any failure: the pool then closes the connection, which rolls
        // the migration transaction back.
        conn.busy = true;
        let c = &mut conn.client;
        let begin = sql::migrate_begin(&self.sql(sql::MIGRATE_BEGIN), self.inner.migrate_lock_ms);
        let sets = c
            .simple_query(begin)
            .await
            .map_err(db)?
            .into_results()
            .await;
        let applied: i32 = sets
            .map_err(db)?
            .iter()
            .flatten()
            .next()
            .map(|r| rows::req(r, 0))
            .transpose()?
            .unwrap_or(0);
        let applied = usize::try_from(applied).unwrap_or(0);
        let pending = versions::pending(self.inner.schema.name(), applied, sql::MIGRATIONS.len())?;
        for i in pending {
            let ddl = self.inner.schema.fill(sql::MIGRATIONS[i]);
            c.simple_query(ddl)
                .await
                .map_err(db)?
                .into_results()
                .await
                .map_err(db)?;
            let version = i32::try_from(i + 1).map_err(Error::backend)?;
            c.execute(&*self.sql(sql::MIGRATE_RECORD), &[&version])
                .await
                .map_err(db)?;
        }
        c.simple_query(sql::MIGRATE_COMMIT)
            .await
            .map_err(db)?
            .into_results()
            .await
            .map_err(db)?;
        conn.done();
        Ok(())
    }

    /// Checks, without changing anything, that the schema exists at the version this
    /// crate reads: for tools that only read and so do not [`migrate`](Self::migrate).
    ///
    /// # Errors
    /// [`Error::Schema`] saying the schema is missing, older (run `migrate`) or newer
    /// (use the newer relayq); [`Error::Backend`] when the server fails.
    pub async fn check_schema(&self) -> Result<()> {
        let sets = self.run(sql::SCHEMA_VERSION, &[]).await?;
        let found: i32 = sets
            .iter()
            .flatten()
            .next()
            .map(|r| rows::req(r, 0))
            .transpose()?
            .unwrap_or(-1);
        // -1: no migrations table.
        let found = usize::try_from(found).ok();
        versions::check(self.inner.schema.name(), found, sql::MIGRATIONS.len())
    }

    /// The schema holding relayq's tables.
    #[must_use]
    pub fn schema(&self) -> &str {
        self.inner.schema.name()
    }

    fn sql(&self, template: &'static str) -> Arc<str> {
        self.inner.schema.sql(template)
    }

    /// Runs one batch and returns its result sets, again while the server aborts it
    /// with an error that running it again resolves (a deadlock victim, a key race:
    /// [`error::retryable`]). Every operation goes through here, reads included (with
    /// READ_COMMITTED_SNAPSHOT off, a reader can be a deadlock victim too), except
    /// enqueue and settle, which retry [`Self::run_once`] with their own decoding.
    /// Running a batch again is safe because a failed batch kept nothing: each runs
    /// its own transaction with `XACT_ABORT` on, and none touches a queue table after
    /// its `COMMIT` (a test in `sql.rs` checks that).
    async fn run(&self, template: &'static str, params: &[&dyn ToSql]) -> Result<Vec<Vec<Row>>> {
        relayq_core::retry::retry_transient(|| self.run_once(template, params), error::retryable)
            .await
    }

    /// Runs one batch once and returns its result sets. A connection whose request
    /// failed goes back to the pool only when the server reported the error and no
    /// transaction is left open ([`conn::Conn::recover`]); one whose request was
    /// abandoned (a timeout, a dropped future) is discarded (see [`conn::Conn::busy`]).
    async fn run_once(
        &self,
        template: &'static str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Vec<Row>>> {
        let sql = self.sql(template);
        let mut conn = self.inner.pool.get().await.map_err(error::pool)?;
        conn.busy = true;
        let sets = match conn.client.query(&*sql, params).await {
            Ok(stream) => stream.into_results().await,
            Err(e) => Err(e),
        };
        match sets {
            Ok(sets) => {
                conn.done();
                Ok(sets)
            }
            Err(e) => {
                conn.recover(&e).await;
                Err(db(e))
            }
        }
    }

    /// Publishes the wake-ups a batch returned (rows of kind `r`/`f` and queue) to this
    /// process's handles on the same database and schema.
    fn wake(&self, rows: &[Row]) -> Result<()> {
        for r in rows {
            let kind: &str = rows::req(r, 0)?;
            let queue: &str = rows::req(r, 1)?;
            let kind = match kind {
                "r" => EventKind::Ready,
                "c" => EventKind::Revoked,
                _ => EventKind::Finished,
            };
            self.inner.events.notify(queue, kind);
        }
        Ok(())
    }
}

impl Events for MssqlBackend {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        Some(self.inner.events.subscribe())
    }
}

/// One event bus per (server, schema) in this process, so a job enqueued through one
/// handle wakes workers on another at once; other processes rely on polling.
fn shared_events(key: &str) -> EventBus {
    static BUSES: OnceLock<Mutex<HashMap<String, EventBus>>> = OnceLock::new();
    BUSES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(key.to_owned())
        .or_default()
        .clone()
}

/// The README's examples compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
