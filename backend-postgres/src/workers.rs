//! SPEC M9: each worker's last beat to a queue, one row per queue and worker.

use relayq_core::{Result, WorkerBeat, WorkerSeen, workers::BEAT_KEPT};

use crate::{PostgresBackend, db, micros};

impl PostgresBackend {
    /// Stores `beat` with the server's time, and drops the queue's beats past
    /// `BEAT_KEPT` (a few rows: the queue's workers).
    pub(crate) async fn beat(&self, queue: &str, beat: &WorkerBeat) -> Result<()> {
        sqlx::query(self.sql(
            "WITH gone AS (DELETE FROM {s}.workers WHERE queue = $1
                             AND last_seen < now() - $4::float8 * interval '1 microsecond')
             INSERT INTO {s}.workers (queue, name, beat, last_seen) VALUES ($1, $2, $3, now())
             ON CONFLICT (queue, name) DO UPDATE SET beat = excluded.beat, last_seen = now()",
        ))
        .bind(queue)
        .bind(&beat.worker)
        .bind(beat.to_stored())
        .bind(micros(BEAT_KEPT) as f64)
        .execute(self.pool())
        .await
        .map_err(db)?;
        Ok(())
    }

    /// The queue's beats within `BEAT_KEPT`, the most recent first.
    pub(crate) async fn seen(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        let rows: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(self.sql(
            "SELECT beat, last_seen FROM {s}.workers
             WHERE queue = $1 AND last_seen > now() - $2::float8 * interval '1 microsecond'
             ORDER BY last_seen DESC, name",
        ))
        .bind(queue)
        .bind(micros(BEAT_KEPT) as f64)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        Ok(rows
            .into_iter()
            .filter_map(|(beat, last_seen)| {
                WorkerBeat::from_stored(&beat).map(|beat| WorkerSeen { beat, last_seen })
            })
            .collect())
    }
}
