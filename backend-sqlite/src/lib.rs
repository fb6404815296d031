//! # relayq-sqlite
//!
//! The embedded default backend of [relayq](https://docs.rs/relayq-core): one SQLite
//! file, no server. It implements every rule of the relayq SPEC (`docs/SPEC.md` in the
//! repository) and passes the whole conformance suite.
//!
//! - **Concurrency**: SQLite has one writer at a time. Every change (enqueue, claim,
//!   settle, cancel, ...) runs in a short `BEGIN IMMEDIATE` transaction, so two
//!   claimers can never take the same job (SPEC C2), and `busy_timeout` makes writers in
//!   other processes wait for the lock instead of failing. The file is in WAL mode, so
//!   readers (stats, progress) never block writers.
//! - **Groups and stages by promotion**: a job is stored `blocked` until its group and
//!   its stage allow it to run, and is promoted to `ready` by the transaction that
//!   finishes what it waited for. A job joining its batch's released stage, with no
//!   group, is stored `ready`. A claim is therefore a plain ordered scan of one
//!   partial index.
//! - **Settles**: a worker gathers up to 512 outcomes per `settle_many` call
//!   (`preferred_settle_batch`): each call takes the write lock and commits once.
//! - **Time** is this machine's clock (the "server" of an embedded database), stored as
//!   microseconds since the epoch.
//! - **Wake-ups**: handles opened in one process on one file share in-process events;
//!   workers in other processes notice new jobs by polling (bounded, default ≤ 1 s).
//! - **Writers in one process queue in order** for the file's write lock: a write
//!   transaction first takes an in-process turn per file, so it never waits in SQLite's
//!   busy handler, which sleeps up to 100 ms between retries. Writers in other
//!   processes still wait through `busy_timeout`.
//! - **Durability**: WAL with `synchronous = NORMAL`: a committed enqueue survives a
//!   crash of the process; a power cut may lose the last transactions.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> relayq_core::Result<()> {
//! use relayq_core::{EnqueueExt, NewJob};
//! use relayq_sqlite::SqliteBackend;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let url = format!("sqlite://{}", dir.path().join("relayq.db").display());
//! let backend = SqliteBackend::open(&url).await?;
//! backend.enqueue_one(NewJob::new("mail", b"hello".to_vec())).await?;
//! # Ok(()) }
//! ```

mod admin;
mod after;
mod barrier;
mod claim;
mod driver;
mod enqueue;
mod hot;
mod inspect;
mod open_error;
mod promote;
mod schedules;
mod settle;
mod workers;

use std::{
    collections::HashMap,
    ops::{Deref, DerefMut},
    path::PathBuf,
    str::FromStr,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use relayq_core::{
    Error, Event, EventBus, EventKind, Events, Limits, Result, kit::schema, retry::Policy,
};
use sqlx::{
    Connection, SqliteConnection, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use tokio::sync::{OwnedMutexGuard, broadcast};

#[doc(hidden)]
pub use driver::DRIVER;
pub use hot::{Hot, Param, hot_statements};

/// How long a writer waits for another process's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A relayq backend on one SQLite database file. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: SqlitePool,
    limits: Limits,
    shared: Shared,
}

impl SqliteBackend {
    /// Opens (creating if missing) the database at `url` (`sqlite://path/to/file.db`)
    /// and applies the migrations.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `url` for a malformed URL; [`Error::Backend`] when the
    /// file cannot be opened or migrated.
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::invalid("url", format!("not a SQLite URL: {e}")))?;
        Self::open_with(options, Limits::default()).await
    }

    /// Opens the database with explicit connection options and limits. WAL mode,
    /// `synchronous = NORMAL`, `busy_timeout` and create-if-missing are always set.
    ///
    /// # Errors
    /// [`Error::Backend`] when the file cannot be opened or migrated.
    pub async fn open_with(options: SqliteConnectOptions, limits: Limits) -> Result<Self> {
        let options = options
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        enable_wal(&options).await?;
        let shared = Shared::of(options.get_filename().to_path_buf());
        let pool = SqlitePoolOptions::new()
            // sqlx would "ping" each connection it hands out: a message to the
            // connection's thread and back, which checks nothing an in-process database
            // can lose, on every statement.
            .test_before_acquire(false)
            .max_connections(4)
            .connect_with(options.clone())
            .await
            .map_err(|e| opening(&e, options.get_filename()).unwrap_or_else(|| db(e)))?;
        migrate(&pool).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                limits,
                shared,
            }),
        })
    }

    /// The connection pool, for callers that want to look at the tables.
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// Starts a write transaction that holds SQLite's write lock from its first
    /// statement, so that its reads and writes are not interleaved with another
    /// writer's (SPEC C2). Returns the transaction and "now", read once the lock is
    /// held: a call that waited for the lock must not be stamped with the time it
    /// started waiting.
    async fn write(&self) -> Result<(Write, DateTime<Utc>)> {
        let turn = self.inner.shared.writer.clone().lock_owned().await;
        let tx = self
            .inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db)?;
        // In whole microseconds, as the database stores times: a lease expiry handed
        // out finer than stored ended up to a microsecond after the one expiry is judged
        // by, and a job could be taken over before the time its holder was told.
        Ok((Write { tx, _turn: turn }, at(us(Utc::now()))))
    }

    fn notify(&self, queue: &str, kind: EventKind) {
        self.inner.shared.events.notify(queue, kind);
    }
}

impl Events for SqliteBackend {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        Some(self.inner.shared.events.subscribe())
    }
}

/// What every handle on one database file in this process shares.
#[derive(Debug, Clone, Default)]
struct Shared {
    /// Wakes the workers of every handle.
    events: EventBus,
    /// The turn to write. SQLite lets one writer in at a time; a second connection's
    /// `BEGIN IMMEDIATE` waits in the busy handler, which polls with sleeps of 1 to
    /// 100 ms, so a settle that promotes the next stage could sit out 25 ms behind a
    /// claim. Queued here instead, in-process writers get the lock in FIFO order the
    /// moment it frees.
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl Shared {
    fn of(path: PathBuf) -> Self {
        static FILES: OnceLock<Mutex<HashMap<PathBuf, Shared>>> = OnceLock::new();
        let key = std::fs::canonicalize(&path).unwrap_or(path);
        FILES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default()
            .clone()
    }
}

/// A write transaction holding this process's turn to write until it ends.
struct Write {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    // Declared after `tx`: dropped after it, so an abandoned transaction's rollback
    // is queued before the next writer goes. (It runs on its connection's thread; a
    // next writer that is quicker waits for it in the busy handler, as other
    // processes do.)
    _turn: OwnedMutexGuard<()>,
}

impl Write {
    async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl Deref for Write {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for Write {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

type Conn = SqliteConnection;

/// Puts the file in WAL mode, once. WAL is a property of the file, and switching to it
/// takes an exclusive lock that `busy_timeout` does not wait for, so handles opening a
/// new file at the same time could fail; this retries with backoff instead. The pool's
/// connections then find the file in WAL mode already.
async fn enable_wal(options: &SqliteConnectOptions) -> Result<()> {
    let wal = options.clone().journal_mode(SqliteJournalMode::Wal);
    let switch = || async {
        let conn = SqliteConnection::connect_with(&wal).await?;
        conn.close().await
    };
    let policy = Policy {
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(200),
        max_retries: Some(20),
        jitter: false,
    };
    // Only a busy or locked file is worth another try; any other failure (a folder
    // that does not exist, no permission) is reported at once.
    policy
        .run(switch, transient_db)
        .await
        .map_err(|e| opening(&e, options.get_filename()).unwrap_or_else(|| db(e)))
}

/// A busy or locked database (SQLite's codes 5 and 6).
fn transient_db(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_)) && transient(e)
}

/// The error for a file SQLite cannot open, naming it and the operating system's
/// reason; `None` for any other error.
fn opening(e: &sqlx::Error, path: &std::path::Path) -> Option<Error> {
    open_error::cannot_open(e).then(|| open_error::explain(path))
}

/// The schema, one entry per version; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_attempt_output.sql"),
    include_str!("../migrations/0003_group_holder.sql"),
    include_str!("../migrations/0004_schedules.sql"),
    include_str!("../migrations/0005_progress.sql"),
    include_str!("../migrations/0006_workers.sql"),
    include_str!("../migrations/0007_budget_and_batch_name.sql"),
    include_str!("../migrations/0008_claimed_at.sql"),
    include_str!("../migrations/0009_limit_keys.sql"),
    include_str!("../migrations/0010_rates.sql"),
    include_str!("../migrations/0011_key_rates.sql"),
    include_str!("../migrations/0012_park_at_enqueue.sql"),
    include_str!("../migrations/0013_dependencies.sql"),
];

/// Applies the migrations not yet applied. The whole check-and-apply runs under
/// SQLite's write lock, so processes opening one file at once cannot both apply one.
async fn migrate(pool: &SqlitePool) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
    let applied: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
    let applied = usize::try_from(applied).unwrap_or(0);
    for sql in &MIGRATIONS[schema::pending("main", applied, MIGRATIONS.len())?] {
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
    }
    // PRAGMA takes no parameters; the value is our own constant.
    let set = format!("PRAGMA user_version = {}", MIGRATIONS.len());
    sqlx::raw_sql(sqlx::AssertSqlSafe(set))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)
}

/// Maps a driver error into the core error, keeping it as the source; transient when
/// the same call may succeed if made again: the database was busy or locked by another
/// connection past the busy timeout (`SQLITE_BUSY`, `SQLITE_LOCKED` and their extended
/// codes), the file could not be read or written for the moment (I/O), or the pool had
/// no connection to give in time.
fn db(e: sqlx::Error) -> Error {
    if transient(&e) {
        Error::transient(e).from_backend("sqlite")
    } else {
        Error::backend(e).from_backend("sqlite")
    }
}

fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6)),
        _ => false,
    }
}

/// Microseconds since the epoch, as stored.
fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The instant stored as `micros`.
fn at(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `now + d`, saturating.
fn plus(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// One ended attempt, for the execution log (SPEC L5).
struct Ended<'a> {
    job: i64,
    attempt: i64,
    worker: &'a str,
    /// The handler's start (SPEC L5).
    started_at: i64,
    claimed_at: i64,
    ended_at: DateTime<Utc>,
    outcome: relayq_core::AttemptOutcome,
    error: Option<&'a str>,
    output: Option<&'a str>,
}

/// Writes one ended attempt to the execution log (SPEC L5).
async fn log_attempt(c: &mut Conn, a: Ended<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO relayq_attempts
             (job_id, attempt, worker, started_at, ended_at, outcome, error, output, claimed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )
    .bind(a.job)
    .bind(a.attempt)
    .bind(a.worker)
    .bind(a.started_at)
    .bind(us(a.ended_at))
    .bind(a.outcome.as_str())
    .bind(a.error)
    .bind(a.output)
    .bind(a.claimed_at)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    Ok(())
}
