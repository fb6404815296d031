//! SPEC M9: each worker's last beat to a queue, one row per queue and worker, taken
//! with the server's time.

use relayq_core::{Result, WorkerBeat, WorkerSeen, retry::retry_transient, workers::BEAT_KEPT};

use crate::{MysqlBackend, at, db};

/// Stores a worker's beat (`queue`, `name`, `beat`) with the server's time
/// (`lock::NOW_US`), or replaces its last one. A statement of its own, outside any
/// transaction: a beat changes no job, so it takes no queue lock and holds only its
/// own row, for that statement.
const BEAT: &str = "INSERT INTO relayq_workers (queue, name, beat, last_seen)
    VALUES (?, ?, ?, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED))
    ON DUPLICATE KEY UPDATE beat = VALUES(beat), last_seen = VALUES(last_seen)";

/// Drops the queue's beats older than `?` microseconds (`BEAT_KEPT`): a few rows, the
/// queue's workers, read through the primary key's prefix. Its own statement too, so
/// that two workers beating at once never wait for each other in a cycle.
const FORGET: &str = "DELETE FROM relayq_workers
    WHERE queue = ? AND last_seen < CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) - ?";

/// The queue's beats within the last `?` microseconds (`BEAT_KEPT`), the most recent
/// first (SPEC M9). `NOW(6)`: the statement's start on the server's clock.
const SEEN: &str = "SELECT beat, last_seen FROM relayq_workers
    WHERE queue = ? AND last_seen > CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) - ?
    ORDER BY last_seen DESC, name";

/// `BEAT_KEPT` in microseconds.
fn kept() -> i64 {
    i64::try_from(BEAT_KEPT.as_micros()).unwrap_or(i64::MAX)
}

impl MysqlBackend {
    /// Stores `beat` with the server's time, and drops the queue's beats past
    /// `BEAT_KEPT`.
    pub(crate) async fn beat(&self, queue: &str, beat: &WorkerBeat) -> Result<()> {
        let text = beat.to_stored();
        retry_transient(
            || self.beat_once(queue, &beat.worker, &text),
            crate::deadlocked,
        )
        .await
    }

    /// One try of [`beat`](Self::beat): both statements are idempotent.
    async fn beat_once(&self, queue: &str, worker: &str, text: &str) -> Result<()> {
        sqlx::query(BEAT)
            .bind(queue)
            .bind(worker)
            .bind(text)
            .execute(&self.inner.pool)
            .await
            .map_err(db)?;
        sqlx::query(FORGET)
            .bind(queue)
            .bind(kept())
            .execute(&self.inner.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// The queue's beats within `BEAT_KEPT`, the most recent first.
    pub(crate) async fn seen(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(SEEN)
            .bind(queue)
            .bind(kept())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        Ok(rows
            .into_iter()
            .filter_map(|(beat, seen)| {
                WorkerBeat::from_stored(&beat).map(|beat| WorkerSeen {
                    beat,
                    last_seen: at(seen),
                })
            })
            .collect())
    }
}
