//! # relayq-redis
//!
//! The Redis backend of [relayq](https://docs.rs/relayq-core), for a standalone server
//! ([`RedisBackend::connect`]) and for Redis Cluster ([`RedisBackend::cluster`]).
//!
//! - **One Lua function per operation** (enqueue many, claim N, settle many, heartbeat,
//!   cancel, batch operations, maintenance, reads): each runs atomically, so claimers
//!   never wait for each other's locks and never take one job twice (SPEC C2, C4).
//!   Inputs are validated in Rust and re-checked in Lua before the first write; time
//!   comes from `TIME` at the start of each call, the server's clock.
//! - **Functions, or scripts**: on Redis ≥ 7.0 the operations are one Redis Functions
//!   library ([`function_library`]), loaded by the first call that finds it missing,
//!   so the shared helpers are defined once per server rather than on every call. A
//!   server that refuses functions (Redis 6, or an ACL without `FCALL`) runs the same
//!   Lua as scripts.
//! - **Cluster**: every key of a queue carries the hash tag `{queue}` (queue names
//!   cannot contain braces), so each script touches one slot; batches live in their
//!   queue's slot.
//! - **Ordering**: claimable jobs sit in a sorted set scored by priority whose members
//!   are the fixed-width `(run_at, id)`: equal scores sort by member, so the order key
//!   `(priority, run_at, id)` is exact with no floating-point packing (SPEC C3).
//!   Delayed and retrying jobs wait in sets scored by due time, moved over by the claim
//!   script in bounded chunks; running jobs sit in a set scored by lease expiry, so
//!   expired leases are found without a scan (SPEC C5).
//! - **Groups and stages by promotion**, as in the other backends: a job is `blocked`
//!   until the script that finishes what it waited for makes it ready (one joining its
//!   batch's released stage, with no group, is stored ready).
//! - **Wake-ups**: scripts `PUBLISH` on one channel per key prefix; a subscriber task
//!   forwards them, and after a reconnect tells every waiter to check once.
//! - **Retention**: finished jobs are kept in a set by finish time and deleted, with
//!   their log, by `maintain` after the retention.
//!
//! ## Durability
//!
//! An enqueue that returned is in Redis's memory. Whether it survives a crash of the
//! server depends on Redis's persistence, not on relayq: with `appendonly yes` and
//! `appendfsync always` every acknowledged write is on disk before the reply; with
//! `appendfsync everysec` (the usual setting) up to about a second of writes can be
//! lost; with RDB snapshots only, everything since the last snapshot. Replication is
//! asynchronous: a failover can lose writes the old primary acknowledged (`WAIT` narrows
//! that window but does not close it). Lost writes mean lost enqueues, or finished jobs
//! that run again; relayq's guarantees hold for what the server kept.

mod admin;
mod driver;
mod eviction;
mod functions;
mod jobs;
mod listen;
mod queues;
mod schedules;
mod scripts;

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use redis::{
    Client, FromRedisValue, IntoConnectionInfo,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    io::tcp::TcpSettings,
};
use relayq_core::{Error, Event, EventBus, Events, Limits, Result, retry::Policy};
use tokio::sync::broadcast;

use crate::listen::Listener;

pub use driver::{CLUSTER_DRIVER, DRIVER};

/// How long a call waits for the server's reply. Every script does a bounded amount of
/// work, but an enqueue of 10,000 jobs of 1 MiB each takes a while to send; the redis
/// crate's default (0.5 s) is too short for that.
pub const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "relayq";

/// The name of the Redis Functions library this version of relayq loads (Redis ≥ 7.0):
/// `relayq_` and a hash of its Lua, so versions never share functions. A server keeps
/// every version's library that ever ran against it; once no worker of an older
/// version runs, `FUNCTION DELETE` the `relayq_*` libraries other than this one
/// (`FUNCTION LIST LIBRARYNAME 'relayq_*'` lists them).
#[must_use]
pub fn function_library() -> &'static str {
    &scripts::LIBRARY.name
}

/// A relayq backend on Redis or Redis Cluster. Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

struct Inner {
    conn: Conn,
    prefix: String,
    channel: String,
    limits: Limits,
    events: EventBus,
    listener: Listener,
    /// Whether operations run as functions: until a server refuses them.
    functions: AtomicBool,
    /// Loads of the library by this handle, and the lock a load holds.
    loaded: AtomicU64,
    loading: tokio::sync::Mutex<()>,
    /// Queues this handle has added to the set of queues in use (`queues.rs`).
    known: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// A connection that reconnects by itself.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Connection settings: Nagle's algorithm off. redis-rs leaves it on, and many small
/// requests share each connection (claims, settles, heartbeats of every slot), so a
/// request written while an earlier one is unacknowledged would wait for that ACK.
fn tcp() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `url` with [`tcp`] settings; a bad URL is an error on `field`.
fn client(url: &str, field: &'static str) -> Result<Client> {
    let info = url
        .into_connection_info()
        .map_err(|e| Error::invalid(field, e.to_string()))?
        .set_tcp_settings(tcp());
    Client::open(info).map_err(|e| Error::invalid(field, e.to_string()))
}

impl RedisBackend {
    /// Connects to a standalone server at `url` (`redis://host:port/db`) with the
    /// default key prefix `relayq`.
    ///
    /// The server's `maxmemory-policy` must be `noeviction`: any other lets Redis delete
    /// queue keys when it fills up, losing jobs silently. `?allow_eviction=true` in the
    /// URL accepts that risk. A server that refuses `CONFIG` (managed services) is not
    /// checked; one line is logged.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] on `url` for a malformed URL, on `allow_eviction` for a
    /// bad value, on `maxmemory-policy` for a server that may evict keys;
    /// [`Error::Backend`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects to a standalone server with key prefix `prefix`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidInput`] on `prefix` for a bad
    /// prefix.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        let (url, allow_eviction) = eviction::split_url(url)?;
        let client = client(&url, "url")?;
        probe(&client).await?;
        let config = ConnectionManagerConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        let mut conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(db)?;
        if !allow_eviction {
            let node = client.get_connection_info().addr().to_string();
            eviction::check(&mut conn, &node).await?;
        }
        Ok(Self::build(Conn::Single(conn), prefix, vec![client]))
    }

    /// Connects to a Redis Cluster through the node `urls` with key prefix `prefix`.
    ///
    /// # Errors
    /// As [`connect_with_prefix`](Self::connect_with_prefix).
    pub async fn cluster(urls: &[&str], prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        let split = urls
            .iter()
            .map(|u| eviction::split_url(u))
            .collect::<Result<Vec<_>>>()?;
        let allow_eviction = split.iter().any(|(_, allow)| *allow);
        let urls: Vec<&str> = split.iter().map(|(u, _)| u.as_str()).collect();
        let cluster = ClusterClientBuilder::new(urls.clone())
            .tcp_settings(tcp())
            .response_timeout(RESPONSE_TIMEOUT)
            // The cluster client would send a request again after a dropped connection,
            // even one the server already ran: a write script would run twice. Reads
            // are run again by `run_idempotent` instead. (Redirects during a slot
            // migration then surface as errors; the worker runtime retries them.)
            .retries(0)
            .build()
            .map_err(|e| Error::invalid("urls", e.to_string()))?;
        let conn = cluster.get_async_connection().await.map_err(db)?;
        let clients = urls
            .iter()
            .map(|u| client(u, "urls"))
            .collect::<Result<Vec<_>>>()?;
        // The nodes named; each master must be set alike (the README says so).
        if !allow_eviction {
            for c in &clients {
                let mut node = c.get_multiplexed_async_connection().await.map_err(db)?;
                let addr = c.get_connection_info().addr().to_string();
                eviction::check(&mut node, &addr).await?;
            }
        }
        Ok(Self::build(Conn::Cluster(conn), prefix, clients))
    }

    fn build(conn: Conn, prefix: &str, clients: Vec<Client>) -> Self {
        let events = EventBus::new();
        let channel = format!("{prefix}:events");
        let cluster = matches!(conn, Conn::Cluster(_));
        let listener = Listener::new(clients, cluster, channel.clone(), events.clone());
        Self {
            inner: Arc::new(Inner {
                conn,
                prefix: prefix.to_owned(),
                channel,
                limits: Limits::default(),
                events,
                listener,
                functions: AtomicBool::new(true),
                loaded: AtomicU64::new(0),
                loading: tokio::sync::Mutex::new(()),
                known: std::sync::Mutex::default(),
            }),
        }
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The base key of `queue`: every key of the queue starts with it, and its hash tag
    /// puts them all in one cluster slot.
    #[must_use]
    pub fn queue_key(&self, queue: &str) -> String {
        format!("{}:{{{queue}}}", self.inner.prefix)
    }

    /// Runs a script that changes nothing (or whose effect is the same when run
    /// twice), again after a dropped connection: the connection reconnects by itself,
    /// but the call in flight when it dropped fails. Scripts that write are not run
    /// again here: one that ran before its reply was lost would run twice.
    async fn run_idempotent<T: FromRedisValue>(
        &self,
        script: &scripts::Op,
        queue: &str,
        args: &[Vec<u8>],
    ) -> Result<T> {
        Policy::RECONNECT
            .run(
                || self.invoke(script, queue, args),
                |e: &redis::RedisError| e.is_io_error() || e.is_connection_dropped(),
            )
            .await
            .map_err(|e| {
                // Tried as often as the policy allows: callers should not try again.
                let lost = e.is_io_error() || e.is_connection_dropped();
                let e = script_error(e);
                if lost { e.retries_spent() } else { e }
            })
    }

    /// Runs `script` for `queue` with `args` after the common ones.
    async fn run<T: FromRedisValue>(
        &self,
        script: &scripts::Op,
        queue: &str,
        args: &[Vec<u8>],
    ) -> Result<T> {
        self.invoke(script, queue, args).await.map_err(script_error)
    }

    /// Runs `op` as a function (loading the library when the server lacks it) or,
    /// once a server refused functions, as a script. See [`scripts`].
    async fn invoke<T: FromRedisValue>(
        &self,
        op: &scripts::Op,
        queue: &str,
        args: &[Vec<u8>],
    ) -> std::result::Result<T, redis::RedisError> {
        let key = self.queue_key(queue);
        let mut loads = 0;
        while self.inner.functions.load(Ordering::Relaxed) {
            let seen = self.inner.loaded.load(Ordering::Acquire);
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(op.function.as_str())
                .arg(1)
                .arg(&key)
                .arg(&self.inner.channel)
                .arg(queue);
            for a in args {
                cmd.arg(a.as_slice());
            }
            let err = match self.query(&cmd).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match functions::refusal(&err) {
                // Nothing ran: load the library and call again. Twice at most, in
                // case someone deleted it again in between.
                Some(functions::Refusal::NotLoaded) if loads < 2 => {
                    loads += 1;
                    self.load_library(seen).await?;
                }
                Some(functions::Refusal::Unsupported) => self.scripts_from_now_on(&err),
                _ => return Err(err),
            }
        }
        let mut inv = op.script.prepare_invoke();
        inv.key(key).arg(&self.inner.channel).arg(queue);
        for a in args {
            inv.arg(a.as_slice());
        }
        match self.inner.conn.clone() {
            Conn::Single(mut c) => inv.invoke_async(&mut c).await,
            Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self.inner.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }

    /// Loads the library, unless another call of this handle loaded it since `seen`
    /// (the count of loads before its `FCALL`): after a restart, every slot's call
    /// finds it missing at once, and one load (of about 36 KB of Lua, compiled on
    /// every master) serves them all. A server that refuses the load switches this
    /// handle to scripts.
    async fn load_library(&self, seen: u64) -> redis::RedisResult<()> {
        let _one_at_a_time = self.inner.loading.lock().await;
        if self.inner.loaded.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        let load = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(scripts::LIBRARY.source.as_str())
            .to_owned();
        match self.query::<redis::Value>(&load).await {
            Ok(_) => {
                self.inner.loaded.fetch_add(1, Ordering::Release);
                Ok(())
            }
            Err(e) if functions::refusal(&e) == Some(functions::Refusal::Unsupported) => {
                self.scripts_from_now_on(&e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn scripts_from_now_on(&self, why: &redis::RedisError) {
        if self.inner.functions.swap(false, Ordering::Relaxed) {
            tracing::info!(
                reason = %why,
                "relayq-redis: the server refused Redis Functions; running scripts instead"
            );
        }
    }

    fn notify_local(&self, queue: &str, kind: relayq_core::EventKind) {
        self.inner.events.notify(queue, kind);
    }
}

impl Events for RedisBackend {
    fn subscribe(&self) -> Option<broadcast::Receiver<Event>> {
        let rx = self.inner.events.subscribe();
        self.inner.listener.start();
        Some(rx)
    }

    /// Every cancel of a running job publishes `c:<queue>` from its script.
    fn pushes_revocations(&self) -> bool {
        true
    }
}

/// Prefixes: 1 to 64 bytes of `A-Z a-z 0-9 _ - . :`, so no brace can spoil the hash tag.
fn check_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "prefix",
            format!("{prefix:?} must be 1 to 64 bytes of A-Z a-z 0-9 _ - . :"),
        ))
    }
}

/// How long the first connection of [`RedisBackend::connect_with_prefix`] may take.
pub const CONNECT_TIMEOUT: std::time::Duration = relayq_core::kit::CONNECT_TIMEOUT;

/// Opens one connection, so that a server that cannot be reached is reported within
/// [`CONNECT_TIMEOUT`] with the driver's cause: the connection manager retries a
/// refused connection with backoff for about ten seconds first.
async fn probe(client: &redis::Client) -> Result<()> {
    let server = format!(
        "the Redis server at {}",
        client.get_connection_info().addr()
    );
    relayq_core::kit::probe(&server, client.get_multiplexed_async_connection(), db).await?;
    Ok(())
}

fn db(e: redis::RedisError) -> Error {
    if transient(&e) {
        Error::transient(e).from_backend("redis")
    } else {
        Error::backend(e).from_backend("redis")
    }
}

/// Whether the same call may succeed if made again, as the driver judges it: a lost,
/// refused or timed-out connection, a server that is loading, busy or without a
/// master, a cluster moving slots (anything but the driver's "no retry"), except a
/// failed authentication, which the driver would reconnect for.
fn transient(e: &redis::RedisError) -> bool {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return false;
    }
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
}

/// Maps a script's error reply: `RELAYQ_INVALID <field> <reason>` and
/// `RELAYQ_STAGE_CLOSED <stage> <released>` are the checks re-done in the script; the
/// rest are server or connection failures.
fn script_error(e: redis::RedisError) -> Error {
    let detail = e.detail().unwrap_or_default();
    match e.code() {
        Some("RELAYQ_INVALID") => {
            let (field, reason) = detail.split_once(' ').unwrap_or((detail, ""));
            let field = match field {
                "batch" => "batch",
                "after" => "after",
                _ => "input",
            };
            Error::invalid(field, reason.to_owned())
        }
        Some("RELAYQ_STAGE_CLOSED") => {
            let mut parts = detail.split(' ').map(str::parse::<i32>);
            match (parts.next(), parts.next()) {
                (Some(Ok(stage)), Some(Ok(released))) => Error::StageClosed { stage, released },
                _ => Error::backend(e),
            }
        }
        // A lost connection fails a script like any call: transient (SPEC X4), so the
        // worker retries a settle and an application may retry an enqueue.
        _ => db(e),
    }
}

/// Decoding script replies.
mod reply {
    use chrono::{DateTime, Utc};
    use redis::Value;
    use relayq_core::{Error, Result};

    pub(crate) fn bad(what: &str) -> Error {
        Error::backend(format!("unexpected reply from a relayq script: {what}"))
    }

    pub(crate) fn items(v: Value) -> Result<Vec<Value>> {
        match v {
            Value::Array(items) => Ok(items),
            Value::Nil => Ok(Vec::new()),
            _ => Err(bad("not an array")),
        }
    }

    pub(crate) fn bytes(v: &Value) -> Result<Vec<u8>> {
        match v {
            Value::BulkString(b) => Ok(b.clone()),
            Value::SimpleString(s) => Ok(s.clone().into_bytes()),
            Value::Int(i) => Ok(i.to_string().into_bytes()),
            _ => Err(bad("not a string")),
        }
    }

    pub(crate) fn text(v: &Value) -> Result<String> {
        String::from_utf8(bytes(v)?).map_err(Error::backend)
    }

    /// A text field where `''` means none.
    pub(crate) fn opt_text(v: &Value) -> Result<Option<String>> {
        let t = text(v)?;
        Ok((!t.is_empty()).then_some(t))
    }

    pub(crate) fn int(v: &Value) -> Result<i64> {
        match v {
            Value::Int(i) => Ok(*i),
            _ => text(v)?.parse().map_err(Error::backend),
        }
    }

    pub(crate) fn time(micros: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

/// Bytes of a number, for script arguments.
fn arg(n: impl std::fmt::Display) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Microseconds in `d`, saturating.
fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The README's examples compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    #[test]
    fn clients_send_without_nagle_delay() {
        let c = super::client("redis://127.0.0.1:6379/0", "url").unwrap();
        assert!(c.get_connection_info().tcp_settings().nodelay());
        let bad = super::client("http://nowhere", "urls").unwrap_err();
        assert!(bad.to_string().contains("urls"), "{bad}");
    }

    /// Found by the torture's enqueues during a Redis restart: a script call on a
    /// dropped connection was reported as a permanent backend error.
    #[test]
    fn a_script_on_a_lost_connection_fails_transiently() {
        for kind in [
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
        ] {
            let e = redis::RedisError::from(std::io::Error::new(kind, "gone"));
            let mapped = super::script_error(e);
            assert!(mapped.is_transient(), "{kind:?}: {mapped:?}");
        }
        let reply = redis::RedisError::from((redis::ErrorKind::Client, "a script bug"));
        assert!(!super::script_error(reply).is_transient());
    }
}
