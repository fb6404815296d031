//! # relayq-mysql
//!
//! The [relayq](https://docs.rs/relayq-core) backend on MariaDB (10.6 and later) and
//! MySQL (8.0.17 and later), through sqlx's MySQL driver.
//!
//! - **Sessions at READ COMMITTED.** Under MySQL's default REPEATABLE READ, locking
//!   reads take next-key and gap locks on every index record they pass, the source of
//!   the deadlocks other queues on MySQL report (an insert waiting for the gap a
//!   claimer holds at the end of an index). READ COMMITTED locks only the rows read.
//! - **One lock per queue orders the writes.** Every write to a queue (enqueue, settle,
//!   cancel, a stage's release, an expiry) first locks the queue's row in
//!   `relayq_queues` exclusively, so the promotion of groups and stages reads and
//!   writes a queue's jobs with nothing else changing them, as SQLite's single writer
//!   does; claims lock the row shared, so they run beside each other and never wait
//!   for another claimer (SPEC C4), only for a write in progress. A call that writes to
//!   several queues (a settle of many leases) locks them in name order.
//! - **Claims** read the queue's head plainly on an index whose equality prefix and
//!   order are the claim's (`schema.rs`), lock those jobs by id `FOR UPDATE SKIP
//!   LOCKED`, then `UPDATE` them by primary key: MySQL has no `UPDATE ... RETURNING`.
//!   Every write changes rows by primary key too (`by_id.rs` says why).
//! - **Deadlocks and lock-wait timeouts** (1213, 1205) are transient, and each write
//!   runs again up to a bounded number of times with jitter
//!   (`relayq_core::retry::retry_transient`).
//! - **Wake-ups by polling**: MySQL cannot notify, so each write counts itself in its
//!   queue's row, and a task per subscribed handle reads the counts, every 20 ms while
//!   they move and up to every 250 ms when they do not (`listen.rs`).
//! - **Time** is the server's clock (`SYSDATE(6)`, read once a transaction holds its
//!   locks), stored as microseconds since the epoch.
//! - **Replication**: `SKIP LOCKED` is unsafe for statement-based replication; a server
//!   with its binary log on must log rows (`binlog_format=ROW`), or [`connect`]
//!   refuses it, saying so.
//!
//! [`connect`]: MysqlBackend::connect

mod admin;
mod after;
mod barrier;
mod by_id;
mod claim;
mod complete_all;
mod driver;
mod enqueue;
mod error;
mod inspect;
mod key_rates;
mod keys;
mod listen;
mod lock;
mod promote;
mod schedules;
mod schema;
mod settle;
mod workers;

use std::{
    collections::HashMap,
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use relayq_core::{Error, Events, Limits, Result};
use sqlx::{
    Executor, MySqlConnection, MySqlPool,
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
};

#[doc(hidden)]
pub use driver::DRIVER;
pub(crate) use error::{db, deadlocked};

/// How a [`MysqlBackend`] connects.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The database relayq's tables live in, created when missing (by a handle that
    /// migrates); `None` for the URL's own.
    pub schema: Option<String>,
    /// The pool's size (default 8).
    pub max_connections: u32,
    /// How long a call waits for a connection from the pool (default 30 s).
    pub acquire_timeout: Duration,
    /// Job limits: payload size and the like.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            schema: None,
            max_connections: 8,
            acquire_timeout: Duration::from_secs(30),
            limits: Limits::default(),
        }
    }
}

impl Config {
    /// Puts relayq's tables in the database `name` (1 to 48 bytes of `a-z 0-9 _`).
    #[must_use]
    pub fn with_schema(mut self, name: impl Into<String>) -> Self {
        self.schema = Some(name.into());
        self
    }

    /// The pool's size.
    #[must_use]
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }
}

/// A relayq backend on a MariaDB or MySQL database. Cheap to clone; clones share the
/// pool.
#[derive(Debug, Clone)]
pub struct MysqlBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: MySqlPool,
    /// The database the tables live in.
    name: String,
    limits: Limits,
    /// The server's `auto_increment_increment`: the step between the ids of one
    /// multi-row insert.
    id_step: i64,
    /// When this handle last looked for expired leases, per queue (SPEC C5).
    expiry: Mutex<HashMap<String, Instant>>,
    /// Its subscribers, and the task that wakes them (`listen.rs`).
    events: Arc<relayq_core::EventBus>,
    listen: relayq_core::kit::wake::ListenTask,
}

impl MysqlBackend {
    /// Connects to `url` (`mysql://USER:PASSWORD@HOST:PORT/DB`, or `mariadb://`) and
    /// migrates its database.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `url` for a malformed URL; a transient error when the
    /// server cannot be reached; [`Error::Backend`] when it refuses.
    pub async fn connect(url: &str) -> Result<Self> {
        let b = Self::connect_with(url, Config::default()).await?;
        b.migrate().await?;
        Ok(b)
    }

    /// Connects with `config`, without migrating: call [`migrate`](Self::migrate) or
    /// [`check_schema`](Self::check_schema).
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidInput`] on `schema` for a bad
    /// database name.
    pub async fn connect_with(url: &str, config: Config) -> Result<Self> {
        let url = url
            .strip_prefix("mariadb://")
            .map_or_else(|| url.to_owned(), |rest| format!("mysql://{rest}"));
        if !url.starts_with("mysql://") {
            return Err(Error::invalid(
                "url",
                "not a MySQL URL: it starts with mysql:// or mariadb://",
            ));
        }
        let options = MySqlConnectOptions::from_str(&url)
            .map_err(|e| Error::invalid("url", format!("not a MySQL URL: {e}")))?;
        // Times are read as `UNIX_TIMESTAMP(SYSDATE(6))`, which goes through the
        // session's time zone: in UTC it has no hour that repeats.
        let options = options.timezone(Some(String::from("+00:00")));
        let mut first = lock::probe(&options).await?;
        lock::check_server(&mut first).await?;
        let name = match &config.schema {
            Some(schema) => {
                relayq_core::validate::schema_name(schema)?;
                schema.clone()
            }
            None => {
                let current: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
                    .fetch_one(&mut first)
                    .await
                    .map_err(db)?;
                current.ok_or_else(|| {
                    Error::invalid("url", "names no database: add one, as in mysql://HOST/DB")
                })?
            }
        };
        let id_step: i64 = sqlx::query_scalar("SELECT CAST(@@auto_increment_increment AS SIGNED)")
            .fetch_one(&mut first)
            .await
            .map_err(db)?;
        let options = options.database(&name);
        schema::close(first).await;
        let pool = MySqlPoolOptions::new()
            .max_connections(config.max_connections.max(2))
            .min_connections(0)
            .acquire_timeout(config.acquire_timeout)
            .after_connect(|c, _| {
                Box::pin(async move {
                    // READ COMMITTED: locking reads lock the rows they return and no
                    // gaps (see the crate's documentation).
                    c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                name,
                limits: config.limits,
                id_step: id_step.max(1),
                expiry: Mutex::default(),
                events: Arc::default(),
                listen: relayq_core::kit::wake::ListenTask::default(),
            }),
        })
    }

    /// Creates the database when missing and brings its tables up to date.
    ///
    /// # Errors
    /// [`Error::Schema`] when the tables are newer than this code; a backend error.
    pub async fn migrate(&self) -> Result<()> {
        let name = &self.inner.name;
        let mut c = self.setup_connection().await?;
        // The name is checked (`a-z 0-9 _`), so it needs no escaping.
        let create = format!("CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4");
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut c)
            .await
            .map_err(db)?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("USE `{name}`")))
            .execute(&mut c)
            .await
            .map_err(db)?;
        let done = schema::migrate(&mut c, name).await;
        schema::close(c).await;
        done
    }

    /// For tools that only read: `Ok` when the tables are at this code's version,
    /// [`Error::Schema`] when they are missing, older or newer.
    ///
    /// # Errors
    /// As above; a backend error.
    pub async fn check_schema(&self) -> Result<()> {
        let name = &self.inner.name;
        let mut c = self.setup_connection().await?;
        let exists: Option<String> = sqlx::query_scalar(
            "SELECT CAST(SCHEMA_NAME AS CHAR) FROM information_schema.SCHEMATA
             WHERE SCHEMA_NAME = ?",
        )
        .bind(name)
        .fetch_optional(&mut c)
        .await
        .map_err(db)?;
        let checked = if exists.is_none() {
            Err(Error::schema(name.clone(), None, schema::SCHEMA_VERSION))
        } else {
            match sqlx::raw_sql(sqlx::AssertSqlSafe(format!("USE `{name}`")))
                .execute(&mut c)
                .await
            {
                Ok(_) => schema::check(&mut c, name).await,
                Err(e) => Err(db(e)),
            }
        };
        schema::close(c).await;
        checked
    }

    /// A connection of its own for set-up, on no database, so that the one relayq
    /// uses may not exist yet.
    async fn setup_connection(&self) -> Result<MySqlConnection> {
        let options = self.inner.pool.connect_options().as_ref().clone();
        let options = options.database("");
        let mut c = lock::probe(&options).await?;
        c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(db)?;
        Ok(c)
    }

    /// The connection pool, for callers that want to look at the tables.
    #[must_use]
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// Closes the pool's connections.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }
}

impl Events for MysqlBackend {
    /// Wakes subscribers by polling each queue's count of writes (`listen.rs`).
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<relayq_core::Event>> {
        let rx = self.inner.events.subscribe();
        let (pool, events) = (self.inner.pool.clone(), self.inner.events.clone());
        self.inner.listen.start(|| listen::poll(pool, events));
        Some(rx)
    }
}

/// The connection a transaction runs on (`&mut *tx`).
pub(crate) type Conn = MySqlConnection;

/// One ended attempt, for the execution log (SPEC L5).
pub(crate) struct Ended<'a> {
    pub(crate) job: i64,
    pub(crate) attempt: i64,
    pub(crate) worker: &'a str,
    /// The handler's start (SPEC L5).
    pub(crate) started_at: i64,
    pub(crate) claimed_at: i64,
    pub(crate) ended_at: i64,
    pub(crate) outcome: relayq_core::AttemptOutcome,
    pub(crate) error: Option<&'a str>,
    pub(crate) output: Option<&'a str>,
}

/// Writes ended attempts to the execution log (SPEC L5), in one statement.
pub(crate) async fn log_attempts(c: &mut Conn, attempts: &[Ended<'_>]) -> Result<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "INSERT INTO relayq_attempts
             (job_id, attempt, worker, started_at, ended_at, outcome, error, output, claimed_at) ",
    );
    q.push_values(attempts, |mut b, a| {
        b.push_bind(a.job)
            .push_bind(a.attempt)
            .push_bind(a.worker)
            .push_bind(a.started_at)
            .push_bind(a.ended_at)
            .push_bind(a.outcome.as_str())
            .push_bind(a.error)
            .push_bind(a.output)
            .push_bind(a.claimed_at);
    });
    q.build().execute(&mut *c).await.map_err(db)?;
    Ok(())
}

/// The instant stored as `micros`.
pub(crate) fn at(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Microseconds since the epoch, as stored.
pub(crate) fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// `now + d` in whole microseconds, saturating.
pub(crate) fn plus(now: i64, d: Duration) -> i64 {
    now.saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
