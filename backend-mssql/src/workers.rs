//! SPEC M9: each worker's last beat to a queue, one row per queue and worker.

use relayq_core::{Result, WorkerBeat, WorkerSeen, workers::BEAT_KEPT};

use crate::{MssqlBackend, rows, sql};

impl MssqlBackend {
    /// Stores `beat` with the server's time, and drops the queue's beats past
    /// `BEAT_KEPT`.
    pub(crate) async fn beat(&self, queue: &str, beat: &WorkerBeat) -> Result<()> {
        let kept = i64::try_from(BEAT_KEPT.as_secs()).unwrap_or(i64::MAX);
        let text = beat.to_stored();
        self.run(
            sql::WORKER_BEAT,
            &[&queue, &beat.worker.as_str(), &text.as_str(), &kept],
        )
        .await?;
        Ok(())
    }

    /// The queue's beats within `BEAT_KEPT`, the most recent first.
    pub(crate) async fn seen(&self, queue: &str) -> Result<Vec<WorkerSeen>> {
        let kept = i64::try_from(BEAT_KEPT.as_secs()).unwrap_or(i64::MAX);
        let sets = self.run(sql::WORKERS, &[&queue, &kept]).await?;
        let mut out = Vec::new();
        for r in rows::set(&sets, 0)? {
            let beat = rows::text(r, 0)?.unwrap_or_default();
            let last_seen = rows::time(r, 1)?;
            if let Some(beat) = WorkerBeat::from_stored(&beat) {
                out.push(WorkerSeen { beat, last_seen });
            }
        }
        Ok(out)
    }
}
