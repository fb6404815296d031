//! # relayq-postgres
//!
//! The PostgreSQL backend of [relayq](https://docs.rs/relayq-core). It implements every
//! rule of the relayq SPEC (`docs/SPEC.md` in the repository) and passes the whole
//! conformance suite against a real server.
//!
//! - **Claims** are one statement: a `MATERIALIZED` CTE selects the earliest ready jobs
//!   `FOR NO KEY UPDATE SKIP LOCKED` over a partial index, read in order whatever the
//!   planner's statistics say, and the `UPDATE` takes exactly those
//!   rows (the CTE form avoids PostgreSQL bug #15715, where `WHERE id IN (SELECT ...
//!   LIMIT n FOR UPDATE SKIP LOCKED)` can update more than `n` rows). Claimers never wait
//!   for each other, and expired leases are taken over by the same statement (SPEC C5).
//! - **Groups and stages by promotion**: a job is stored `blocked` until its group and
//!   its stage allow it to run; the transaction that finishes what it waited for promotes
//!   it. A job joining its batch's released stage, with no group, is stored `ready`. Promotions are serialized per batch (its row lock) and per group (an advisory
//!   transaction lock), always taken in the order job rows, batches, groups. A settle
//!   that holds another waiting job of the stage (a witness) skips the batch's lock
//!   and promotion: it cannot be the one that releases the next stage.
//! - **Finished jobs leave the hot table**: they move to `finished` (kept for the
//!   retention, SPEC M3) in the transaction that finishes them, so the claim index only
//!   covers live work. The attempt that succeeded stays on that `finished` row; every
//!   other ended attempt is a row of the `attempts` log.
//! - **Claims do not wait for the disk**: a claim commits without waiting for its
//!   write-ahead log flush; one lost in a server crash only makes its jobs claimable
//!   again. Settles and enqueues wait as usual. [`Config::durable_claims`] makes claims
//!   wait too.
//! - **Settles are batched**: one statement settles many leases, each fenced by its own
//!   token; a plain job's completion costs one statement and one commit per batch.
//!   The settle's transaction runs generic plans from its first statement
//!   (`SET LOCAL plan_cache_mode`, for that transaction only), so a new connection
//!   does not plan each of them afresh five times.
//! - **Wake-ups**: `LISTEN/NOTIFY` on one channel per schema, as a hint only; after a
//!   dropped connection the listener listens again and every worker polls once.
//! - **Transactional enqueue**: [`PostgresBackend::enqueue_in`] stores jobs in the
//!   caller's transaction: they exist only if it commits.
//! - **Schema**: everything lives in one schema (default `relayq`), created by
//!   [`PostgresBackend::migrate`], which is safe to run from many processes at once.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use relayq_core::{EnqueueExt, NewJob};
//! use relayq_postgres::PostgresBackend;
//!
//! let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test").await?;
//! backend.migrate().await?;
//! backend.enqueue_one(NewJob::new("mail", b"hello".to_vec())).await?;
//! # Ok(()) }
//! ```

mod admin;
mod after;
mod barrier;
mod claim;
mod driver;
mod enqueue;
mod explain;
mod inspect;
mod keys;
mod listen;
mod promote;
mod schedules;
mod schema;
mod settle;
#[cfg(test)]
mod test_schema;
mod workers;

use std::{str::FromStr, sync::Arc, time::Duration};

use relayq_core::{Error, Event, EventBus, Events, Limits, Result};
use sqlx::{
    Connection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use tokio::sync::broadcast;

pub use driver::DRIVER;
pub use schema::{DEFAULT_SCHEMA, SCHEMA_VERSION};

use crate::{listen::Listener, schema::Schema};

/// Settings of a [`PostgresBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The schema holding relayq's tables (default `relayq`): 1 to 48 bytes of
    /// `a-z 0-9 _`. Several applications (or test runs) can share one database by
    /// using different schemas.
    pub schema: String,
    /// Payload size limit and the like.
    pub limits: Limits,
    /// Pool size for [`PostgresBackend::connect_with`] (default 10). One connection is
    /// held by the notification listener once something subscribes to events.
    pub max_connections: u32,
    /// Connections the pool opens before [`PostgresBackend::connect_with`] returns and
    /// keeps open (default 0: each is opened when first needed). Opening one mid-load
    /// stalls the call that needed it for the whole set-up: over TLS with sqlx that
    /// took about 90 ms on loopback here, against 2–5 ms without (sqlx 0.9 sets no
    /// `TCP_NODELAY`, so Nagle held two of the TLS handshake's writes for a delayed ACK).
    /// A worker uses up to 2 claim and 4 settle connections at once, plus one per
    /// heartbeat in progress.
    pub min_connections: u32,
    /// How long an operation waits for a connection from the pool (and
    /// [`PostgresBackend::connect_with`] for the first one) before failing with
    /// [`Error::Backend`]; default 30 s.
    pub acquire_timeout: Duration,
    /// Whether a claim waits for its commit to reach the disk (default `false`).
    ///
    /// By default a claim commits with `synchronous_commit = off`, for its own
    /// transaction only: it returns without waiting for the write-ahead log to be
    /// flushed, which the next settle or enqueue does, or the server's WAL writer
    /// within `3 × wal_writer_delay` (600 ms by default). A claim lost in a server crash
    /// leaves its jobs as they were before it, claimable again: a worker that had
    /// started one cannot settle it (its token is unknown, `StaleLease`), and the job
    /// runs again, as jobs whose worker lost its connection in the crash may anyway.
    /// The lost attempt is neither counted nor logged, so a job whose handler brings
    /// the database server down is retried without reaching `max_attempts`; durable
    /// claims count it. Every other write, settles and enqueues
    /// among them, waits for its flush as the server is configured to, so an
    /// acknowledged enqueue or completion is never lost, and a completion's flush
    /// includes the claim before it. Set `true` to make claims wait as well: claims
    /// then also survive a crash, at the cost of one flush wait each (about 20% of
    /// drain throughput without prefetch here).
    pub durable_claims: bool,
    /// How long [`PostgresBackend::migrate`] waits for a table lock before giving up
    /// (default 5 s). A migration that alters a table waits for every transaction
    /// using it, and while it waits, claims and settles queue behind it: a long query
    /// on `finished` would stall the workers for as long as it runs. Past this time
    /// `migrate` fails, changes nothing, and can simply be run again later. 1 ms to
    /// about 24 days (PostgreSQL's limit).
    pub migrate_lock_timeout: Duration,
    /// A pooled connection idle at least this long is checked with a round trip before
    /// an operation uses it (default 1 s); one used more recently is not. sqlx checks
    /// every connection it hands out, which made each claim wait for two round trips
    /// where one does the work (sqlx's ping of each connection on its way back to the
    /// pool remains, off the caller's path). Each
    /// connection that dies within this time after its last use fails one operation,
    /// the next that takes it, with [`Error::Backend`]: a worker's claim backs off and claims again, a settle is
    /// retried, an enqueue's caller gets the error. `Duration::ZERO` checks every
    /// connection, as sqlx does by default. Applies to [`PostgresBackend::connect_with`];
    /// a pool given to [`PostgresBackend::from_pool`] keeps its own settings.
    pub check_after_idle: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            schema: DEFAULT_SCHEMA.to_owned(),
            limits: Limits::default(),
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(30),
            durable_claims: false,
            migrate_lock_timeout: Duration::from_secs(5),
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

    /// The settings with another acquire timeout.
    #[must_use]
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The settings with another pool size.
    #[must_use]
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// The settings with `n` connections opened up front and kept open.
    #[must_use]
    pub fn with_min_connections(mut self, n: u32) -> Self {
        self.min_connections = n;
        self
    }

    /// The settings with claims that wait for their commit to be flushed (see
    /// [`durable_claims`](Self::durable_claims)).
    #[must_use]
    pub fn with_durable_claims(mut self, durable: bool) -> Self {
        self.durable_claims = durable;
        self
    }

    /// The settings with another [`migrate_lock_timeout`](Self::migrate_lock_timeout).
    #[must_use]
    pub fn with_migrate_lock_timeout(mut self, timeout: Duration) -> Self {
        self.migrate_lock_timeout = timeout;
        self
    }

    /// The settings with another [`check_after_idle`](Self::check_after_idle).
    #[must_use]
    pub fn with_check_after_idle(mut self, idle: Duration) -> Self {
        self.check_after_idle = idle;
        self
    }
}

/// A relayq backend on a PostgreSQL database. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    schema: Schema,
    limits: Limits,
    durable_claims: bool,
    migrate_lock_timeout: Duration,
    events: EventBus,
    listener: Listener,
    /// When this handle's claims last looked for expired leases, per queue.
    expiry: claim::ExpiryClock,
    /// Queues last found to have a rate as their only limit (`claim::RatedQueues`).
    rated: claim::RatedQueues,
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user@host/db`) with the default [`Config`].
    /// Call [`migrate`](Self::migrate) before first use of a new database or schema.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `url` for a malformed URL; [`Error::Backend`] when the
    /// server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, Config::default()).await
    }

    /// Connects to `url` with `config`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidInput`] on `schema` for a bad
    /// schema name, and on `min_connections` when it exceeds `max_connections`.
    pub async fn connect_with(url: &str, config: Config) -> Result<Self> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::invalid(
                "url",
                "must start with postgres:// or postgresql://",
            ));
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| Error::invalid("url", format!("not a PostgreSQL URL: {e}")))?;
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("relayq"),
        };
        let schema = Schema::new(&config.schema)?;
        check_lock_timeout(config.migrate_lock_timeout)?;
        let max = config.max_connections.max(2);
        if config.min_connections > max {
            return Err(Error::invalid(
                "min_connections",
                format!(
                    "{} is more than the pool's size ({max}: max_connections, at least 2)",
                    config.min_connections
                ),
            ));
        }
        probe(&options).await?;
        let check_after = config.check_after_idle;
        let pool = PgPoolOptions::new()
            // The hook below replaces sqlx's check of every connection it hands out.
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= check_after {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .max_connections(max)
            .min_connections(config.min_connections)
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options)
            .await
            .map_err(db)?;
        Ok(Self::build(pool, schema, &config))
    }

    /// A backend on an existing pool. No session setting is needed: the statements are
    /// written so that PostgreSQL's cached generic plans stay on the indexes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `schema` for a bad schema name, on
    /// `migrate_lock_timeout` for one out of range.
    pub fn from_pool(pool: PgPool, config: &Config) -> Result<Self> {
        let schema = Schema::new(&config.schema)?;
        check_lock_timeout(config.migrate_lock_timeout)?;
        Ok(Self::build(pool, schema, config))
    }

    fn build(pool: PgPool, schema: Schema, config: &Config) -> Self {
        let events = EventBus::new();
        let listener = Listener::new(pool.clone(), schema.channel(), events.clone());
        Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                limits: config.limits,
                durable_claims: config.durable_claims,
                migrate_lock_timeout: config.migrate_lock_timeout,
                events,
                listener,
                expiry: claim::ExpiryClock::default(),
                rated: claim::RatedQueues::default(),
            }),
        }
    }

    /// Creates the schema and its tables, or brings them up to date. Safe to run from
    /// many processes at once: the migrations run in one transaction under an advisory
    /// transaction lock per schema. A table lock not granted within
    /// [`Config::migrate_lock_timeout`] fails it, with nothing changed, rather than
    /// leave workers queued behind it.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails, when a table lock was not granted in
    /// time, or when the schema was created by a newer relayq-postgres.
    pub async fn migrate(&self) -> Result<()> {
        let timeout = self.inner.migrate_lock_timeout;
        self.inner.schema.migrate(&self.inner.pool, timeout).await
    }

    /// Checks, without changing anything, that the schema exists at the version this
    /// crate reads ([`SCHEMA_VERSION`]): for tools that only read and so do not
    /// [`migrate`](Self::migrate).
    ///
    /// # Errors
    /// [`Error::Backend`] saying the schema is missing, older (run `migrate`) or newer
    /// (use the newer relayq), or that the server failed.
    pub async fn check_schema(&self) -> Result<()> {
        self.inner.schema.check(&self.inner.pool).await
    }

    /// The connection pool, for callers that want to look at the tables.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding relayq's tables.
    #[must_use]
    pub fn schema(&self) -> &str {
        self.inner.schema.name()
    }

    /// Tells this handle's own subscribers at once, without the round trip through
    /// the server (which delivers the same notifications to every other handle).
    fn notify_local(&self, payloads: &[String]) {
        for p in payloads {
            listen::forward(&self.inner.events, p);
        }
    }

    /// The statement `template` written for this backend's schema.
    fn sql(&self, template: &'static str) -> sqlx::AssertSqlSafe<Arc<str>> {
        self.inner.schema.sql(template)
    }

    /// The statement `template` with `{limit}` set to `limit` (see [`Schema::sql_limit`]).
    fn sql_limit(&self, template: &'static str, limit: u32) -> sqlx::AssertSqlSafe<Arc<str>> {
        self.inner.schema.sql_limit(template, limit)
    }
}

impl Events for PostgresBackend {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        let rx = self.inner.events.subscribe();
        self.inner.listener.start();
        Some(rx)
    }

    /// Every cancel sends `NOTIFY` in its transaction.
    fn pushes_revocations(&self) -> bool {
        true
    }
}

/// Maps a driver error into the core error, keeping it as the source.
/// PostgreSQL's `lock_timeout` takes 1 ms to `i32::MAX` ms (0 would mean no limit).
fn check_lock_timeout(timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) || timeout.as_millis() > i32::MAX as u128 {
        return Err(Error::invalid(
            "migrate_lock_timeout",
            format!("{timeout:?} is outside 1 ms to {} ms", i32::MAX),
        ));
    }
    Ok(())
}

/// How long [`PostgresBackend::connect_with`]'s first connection may take.
pub const CONNECT_TIMEOUT: Duration = relayq_core::kit::CONNECT_TIMEOUT;

/// Opens and closes one connection, so that a server that cannot be reached is reported
/// within [`CONNECT_TIMEOUT`] with the driver's own cause (refused, unknown host,
/// authentication, TLS). The pool alone retries a refused connection until its acquire
/// timeout, 30 s by default, and then reports only that it timed out.
async fn probe(options: &PgConnectOptions) -> Result<()> {
    use sqlx::Connection as _;
    let server = format!(
        "the PostgreSQL server at {}:{}",
        options.get_host(),
        options.get_port()
    );
    let conn =
        relayq_core::kit::probe(&server, sqlx::PgConnection::connect_with(options), db).await?;
    conn.close().await.map_err(db)
}

fn db(e: sqlx::Error) -> Error {
    // A missing table, column or function: the schema was never created, was dropped,
    // or is older than this crate (its statements would fail the same way each time).
    if let Some(gone) = schema_gone(&e) {
        return gone;
    }
    if transient(&e) {
        Error::transient(e).from_backend("postgres")
    } else {
        Error::backend(e).from_backend("postgres")
    }
}

/// [`Error::Schema`] for an undefined table (42P01: the schema is missing), column or
/// function (42703, 42883: it is older), naming the schema when the server's message
/// does (`relation "relayq.jobs" does not exist`; every statement here qualifies its
/// tables).
fn schema_gone(e: &sqlx::Error) -> Option<Error> {
    use relayq_core::SchemaState;

    let sqlx::Error::Database(d) = e else {
        return None;
    };
    let state = match d.code().as_deref()? {
        "42P01" => SchemaState::Missing,
        "42703" => SchemaState::Older,
        // 42883 is also "operator does not exist", a fault of a statement, not of the
        // schema: only a missing function (one a later migration adds) counts.
        "42883" if d.message().starts_with("function ") => SchemaState::Older,
        _ => return None,
    };
    let schema = d
        .message()
        .split('"')
        .nth(1)
        .and_then(|relation| relation.rsplit_once('.'))
        .map_or("(this handle's schema)", |(schema, _)| schema);
    Some(Error::Schema {
        schema: schema.to_owned(),
        state,
        found: None,
        wanted: SCHEMA_VERSION,
    })
}

/// Whether the same call may succeed if made again: the connection failed or was
/// lost, the pool had none to give in time, or the server aborted the statement to
/// resolve a race, was short of resources, shutting down or starting, or cancelled it
/// at a time limit (SQLSTATE classes 08 and 53; 40001, 40P01, 55P03, 57014, 57P01-03).
fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        // A connection that ends while sqlx asks the server for TLS (the first thing a
        // new connection says) comes back as this protocol error, not as an I/O one:
        // sqlx reads the missing answer as a zero byte. Only a server that does not
        // speak PostgreSQL answers the same, and telling the caller to retry that is
        // the smaller harm than calling every dropped new connection permanent.
        sqlx::Error::Protocol(what) => what.contains("unexpected response from SSLRequest"),
        sqlx::Error::Database(d) => d.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(
                    code.as_ref(),
                    "40001" | "40P01" | "55P03" | "57014" | "57P01" | "57P02" | "57P03"
                )
        }),
        _ => false,
    }
}

/// Whether `e` is a deadlock (or serialization failure) that running the transaction
/// again can resolve (with [`relayq_core::retry::retry_transient`]). Locks are taken in a fixed order, so these are rare (see
/// `promote`).
fn retryable(e: &Error) -> bool {
    match e
        .backend_source()
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
    {
        Some(sqlx::Error::Database(d)) => matches!(d.code().as_deref(), Some("40P01" | "40001")),
        _ => false,
    }
}

/// Microseconds in `d`, saturating, for `$n * interval '1 microsecond'`.
fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The README's examples compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
