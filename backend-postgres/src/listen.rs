//! LISTEN/NOTIFY wake-ups (SPEC W2, B5). Notifications are hints: a lost one costs at
//! most a poll interval, never a job.
//!
//! Writers send `pg_notify(channel, "<kind>:<queue>")` inside their transaction, so it
//! is delivered when (and only if) it commits; a plain enqueue, one statement of its
//! own, sends it right after its commit instead ([`send_after_commit`]). One listener
//! task per backend handle, started by the first
//! [`subscribe`](relayq_core::Events::subscribe), forwards them to the handle's
//! [`EventBus`]. When its connection drops, it connects and listens again and sends
//! [`EventKind::Resync`](relayq_core::EventKind) so every waiter checks once:
//! notifications sent meanwhile are gone.

use std::time::Duration;

pub(crate) use relayq_core::kit::wake::{FINISHED, READY, forward, messages as payloads};
use relayq_core::{EventBus, kit::wake::ListenTask, retry::Policy};
use sqlx::{PgPool, postgres::PgListener};

/// Longest wait between two attempts to reconnect the listener.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The listener task of one backend handle; stopped when the handle is dropped.
#[derive(Debug)]
pub(crate) struct Listener {
    pool: PgPool,
    channel: String,
    events: EventBus,
    task: ListenTask,
}

impl Listener {
    pub(crate) fn new(pool: PgPool, channel: String, events: EventBus) -> Self {
        Self {
            pool,
            channel,
            events,
            task: ListenTask::default(),
        }
    }

    /// Starts the task, once, if a tokio runtime is running (otherwise callers poll).
    pub(crate) fn start(&self) {
        self.task
            .start(|| listen(self.pool.clone(), self.channel.clone(), self.events.clone()));
    }
}

/// Listens until aborted: connect, LISTEN, tell waiters to re-check, forward
/// notifications; on any error start over after a short backoff.
async fn listen(pool: PgPool, channel: String, events: EventBus) {
    let relisten = Policy {
        min_delay: Duration::from_millis(20),
        max_delay: MAX_BACKOFF,
        max_retries: None,
        jitter: true,
    };
    let mut backoff = relisten.backoff();
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener.listen(&channel).await {
                Ok(()) => {
                    backoff = relisten.backoff();
                    events.resync();
                    // `try_recv` gives `None` when the connection dropped and `Err` on
                    // other failures: either way, listen again on a new connection.
                    while let Ok(Some(n)) = listener.try_recv().await {
                        forward(&events, n.payload());
                    }
                    tracing::debug!(channel, "relayq listener lost its connection");
                }
                Err(e) => tracing::warn!(channel, error = %e, "relayq LISTEN failed"),
            },
            Err(e) => tracing::warn!(channel, error = %e, "relayq listener cannot connect"),
        }
        tokio::time::sleep(backoff.next().unwrap_or(MAX_BACKOFF)).await;
    }
}

/// Sends `payloads` on `channel` within the transaction on `c`, or, outside one, in a
/// transaction of their own.
pub(crate) async fn send(
    c: &mut sqlx::PgConnection,
    channel: &str,
    payloads: &[String],
) -> relayq_core::Result<()> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .bind(channel)
        .bind(payloads)
        .execute(c)
        .await
        .map_err(crate::db)?;
    Ok(())
}

/// Sends `payloads` on `channel` in a transaction of their own, on `c` outside any
/// transaction, after the writes they announce have committed.
///
/// Why: PostgreSQL serializes the commits of transactions that sent a notification.
/// `PreCommit_Notify` takes a cluster-wide lock and holds it until the commit's WAL
/// flush is done, so single-job enqueues from concurrent producers, each notifying
/// inside its own commit, committed one flush at a time (8 producers: about 30% of the
/// rate without a notification). Sent here, the enqueue's commit flushes alongside the
/// others', and this transaction, which wrote nothing before its commit record, commits
/// without waiting for a flush (`RecordTransactionCommit`), so it holds the lock only
/// briefly.
///
/// A notification is a hint. If this fails (say, PostgreSQL's notification queue is
/// full because a listener stopped reading), the jobs are stored all the same and
/// other processes find them when they next poll, so the failure is logged, not
/// returned. Before, such an enqueue failed and stored nothing. A caller that drops the
/// enqueue's future between the two statements (a timeout around it) also leaves the
/// jobs stored and unannounced, without a log line.
pub(crate) async fn send_after_commit(
    c: &mut sqlx::PgConnection,
    channel: &str,
    payloads: &[String],
) {
    if let Err(e) = send(c, channel, payloads).await {
        tracing::warn!(channel, error = %e, "relayq could not send a wake-up notification");
    }
}
