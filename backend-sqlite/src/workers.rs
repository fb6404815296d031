//! SPEC M9: each worker's last beat to a queue, one row per queue and worker.

use relayq_core::{Result, WorkerBeat, WorkerSeen, workers::BEAT_KEPT};

use crate::{SqliteBackend, at, db, us};

impl SqliteBackend {
    /// Stores `beat` with the time now, and drops the queue's beats past `BEAT_KEPT`
    /// (a few rows: the queue's workers).
    pub(crate) async fn beat(&self, queue: &str, beat: &WorkerBeat) -> Result<()> {
        let (mut tx, now) = self.write().await?;
        let kept = us(now) - i64::try_from(BEAT_KEPT.as_micros()).unwrap_or(i64::MAX);
        sqlx::query("DELETE FROM relayq_workers WHERE queue = ?1 AND last_seen < ?2")
            .bind(queue)
            .bind(kept)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(
            "INSERT INTO relayq_workers (queue, name, beat, last_seen) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (queue, name) DO UPDATE SET beat = excluded.beat,
                                                     last_seen = excluded.last_seen",
        )
        .bind(queue)
        .bind(&beat.worker)
        .bind(beat.to_stored())
        .bind(us(now))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(())
    }

    /// The queue's beats within `BEAT_KEPT`, the most recent first.
    pub(crate) async fn seen(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        let kept =
            us(chrono::Utc::now()) - i64::try_from(BEAT_KEPT.as_micros()).unwrap_or(i64::MAX);
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT beat, last_seen FROM relayq_workers WHERE queue = ?1 AND last_seen > ?2
             ORDER BY last_seen DESC, name",
        )
        .bind(queue)
        .bind(kept)
        .fetch_all(self.pool())
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
