//! SPEC L: settling leases, each fenced by its token, many in one transaction.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, Complete, Error, EventKind, JobState, Lease, Outcome, Result, Settle, Settled,
    validate,
};

use crate::{Conn, Ended, SqliteBackend, at, db, log_attempt, plus, promote, us};

/// The job row after a fenced update.
#[derive(sqlx::FromRow)]
struct After {
    state: String,
    run_at: i64,
    attempts: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    worker: String,
    started_at: i64,
}

// Every statement below only touches the row while the lease holds: same job, same
// token, still running, not expired (SPEC L1).
const COMPLETE: &str = "UPDATE relayq_jobs
    SET state = 'succeeded', finished_at = ?3, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";
const FAIL: &str = "UPDATE relayq_jobs
    SET state = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN 'retrying' ELSE 'dead' END,
        run_at = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN ?5 ELSE run_at END,
        finished_at = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN NULL ELSE ?3 END,
        last_error = ?6, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";
const RELEASE: &str = "UPDATE relayq_jobs
    SET state = 'ready', attempts = attempts - 1, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";

#[async_trait]
impl Complete for SqliteBackend {
    /// 512: each call takes the database's one write lock and commits, a cost per call
    /// beyond its leases (docs/BENCHMARKS.md, Findings 21).
    fn preferred_settle_batch(&self) -> usize {
        512
    }

    async fn settle_many(&self, mut settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        validate::settles(&mut settles)?;
        let (mut tx, now) = self.write().await?;
        let mut out = Vec::with_capacity(settles.len());
        let mut touched = promote::Touched::default();
        for s in &settles {
            out.push(settle_one(&mut tx, s, now, &mut touched).await?);
        }
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        let mut queues: Vec<&str> = settles
            .iter()
            .zip(&out)
            .filter(|(_, r)| r.is_ok())
            .map(|(s, _)| s.lease.queue.as_str())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        for q in queues {
            self.notify(q, EventKind::Finished);
            self.notify(q, EventKind::Ready);
        }
        Ok(out)
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        validate::lease_length("extend", extend)?;
        let (mut tx, now) = self.write().await?;
        let until = plus(now, extend);
        let held: Option<i64> = sqlx::query_scalar(
            "UPDATE relayq_jobs SET lease_expires_at = ?4
             WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
               AND queue = ?5
             RETURNING id",
        )
        .bind(lease.job.0)
        .bind(lease.token.0.as_bytes().as_slice())
        .bind(us(now))
        .bind(us(until))
        .bind(&lease.queue)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        held.map(|_| until).ok_or(Error::StaleLease)
    }
}

/// Settles one lease inside the transaction. The outer error is a database failure
/// (the whole call fails); the inner one is this lease's verdict.
async fn settle_one(
    c: &mut Conn,
    s: &Settle,
    now: DateTime<Utc>,
    touched: &mut promote::Touched,
) -> Result<Result<Settled>> {
    let (sql, error, retry_at) = match &s.outcome {
        Outcome::Complete => (COMPLETE, None, None),
        Outcome::Fail { error, retry } => {
            let retry_at = retry.delay(s.lease.attempt, now).map(|d| us(plus(now, d)));
            (FAIL, Some(error.as_str()), retry_at)
        }
        Outcome::Release => (RELEASE, None, None),
    };
    let mut query = sqlx::query_as::<_, After>(sql)
        .bind(s.lease.job.0)
        .bind(s.lease.token.0.as_bytes().as_slice())
        .bind(us(now))
        .bind(&s.lease.queue);
    if matches!(s.outcome, Outcome::Fail { .. }) {
        query = query.bind(retry_at).bind(error);
    }
    let row = query.fetch_optional(&mut *c).await.map_err(db)?;
    let Some(row) = row else {
        return Ok(Err(Error::StaleLease));
    };
    let (outcome, attempt, settled) = match (&s.outcome, row.state.as_str()) {
        (Outcome::Complete, _) => (AttemptOutcome::Succeeded, row.attempts, Settled::Completed),
        (Outcome::Release, _) => (
            AttemptOutcome::Released,
            row.attempts + 1,
            Settled::Released,
        ),
        (Outcome::Fail { .. }, "retrying") => (
            AttemptOutcome::Failed,
            row.attempts,
            Settled::Retrying { at: at(row.run_at) },
        ),
        (Outcome::Fail { .. }, _) => (AttemptOutcome::Failed, row.attempts, Settled::Dead),
    };
    let ended = Ended {
        job: s.lease.job.0,
        attempt,
        worker: &row.worker,
        started_at: row.started_at,
        ended_at: now,
        outcome,
        error,
        output: s.output.as_deref(),
    };
    log_attempt(c, ended).await?;
    let finished = match settled {
        Settled::Completed => Some(JobState::Succeeded),
        Settled::Dead => Some(JobState::Dead),
        Settled::Retrying { .. } | Settled::Released => None,
    };
    if let (Settled::Released, Some(group)) = (settled, row.group_key.as_deref()) {
        // A released job no longer holds its group: an earlier job of the group whose
        // stage was released meanwhile goes first (SPEC G2).
        touched.group(&s.lease.queue, group);
    }
    if let Some(state) = finished {
        let f = promote::Finished {
            queue: &s.lease.queue,
            group: row.group_key.as_deref(),
            batch: row.batch_id,
            stage: row.stage,
            state,
        };
        touched.finished(c, &f, now).await?;
    }
    Ok(Ok(settled))
}
