//! SPEC L: settling leases, each fenced by its token, many in one transaction that
//! holds their queues' locks; heartbeats, lost leases and progress, each on its row.

use std::{collections::HashSet, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, Complete, Error, JobId, JobState, Lease, Outcome, ProgressReport, Result,
    Settle, Settled, retry::retry_transient,
};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, Ended, MysqlBackend, at, db, deadlocked, log_attempts, plus, promote};

/// The row of a lease that holds: same job, same token, still running, not expired
/// (SPEC L1), in the queue the lease names.
const HELD: &str = "SELECT attempts, max_attempts, budget, run_at, CAST(group_key AS CHAR),
        batch_id, stage, CAST(COALESCE(worker, '') AS CHAR), COALESCE(started_at, 0),
        CAST(limit_key AS CHAR)
    FROM relayq_jobs
    WHERE id = ? AND lease_token = ? AND state = 'running' AND lease_expires_at > ?
      AND queue = ?";

/// A held row, as [`HELD`] reads it.
type Held = (
    i64,
    i64,
    Option<i64>,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
    String,
    i64,
    Option<String>,
);

/// A fenced settle's new state, by primary key.
const SET_STATE: &str = "UPDATE relayq_jobs
    SET state = ?, run_at = ?, attempts = ?, finished_at = ?, last_error = COALESCE(?, last_error),
        lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?";

#[async_trait]
impl Complete for MysqlBackend {
    fn preferred_settle_batch(&self) -> usize {
        512
    }

    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        if settles.is_empty() {
            return Ok(Vec::new());
        }
        let queues: Vec<&str> = settles.iter().map(|s| s.lease.queue.as_str()).collect();
        retry_transient(
            || async {
                let (mut tx, now) = self.write(&queues).await?;
                let mut touched = promote::Touched::default();
                let out = if crate::complete_all::alone(&settles) {
                    crate::complete_all::complete_all(&mut tx, &settles, now, &mut touched).await?
                } else {
                    let mut out = Vec::with_capacity(settles.len());
                    let mut seen = HashSet::with_capacity(settles.len());
                    for s in &settles {
                        // A lease given twice counts once: the later ones find it settled.
                        if !seen.insert((s.lease.job, s.lease.token)) {
                            out.push(Err(Error::StaleLease));
                            continue;
                        }
                        out.push(settle_one(&mut tx, s, now, &mut touched).await?);
                    }
                    out
                };
                touched.promote(&mut tx).await?;
                tx.commit().await.map_err(db)?;
                Ok(out)
            },
            deadlocked,
        )
        .await
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        // The server's clock read in the statement, after the row's lock: a time read
        // before (in another call, or before a wait for the lock) could extend a lease
        // that an expiry pass had ended meanwhile.
        let extend = i64::try_from(extend.as_micros()).unwrap_or(i64::MAX);
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let held = sqlx::query(
            "UPDATE relayq_jobs
             SET lease_expires_at = CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) + ?
             WHERE id = ? AND lease_token = ? AND state = 'running' AND queue = ?
               AND lease_expires_at > CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)",
        )
        .bind(extend)
        .bind(lease.job.0)
        .bind(lease.token.0.as_bytes().as_slice())
        .bind(&lease.queue)
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if held == 0 {
            return Err(Error::StaleLease);
        }
        let until: i64 =
            sqlx::query_scalar("SELECT lease_expires_at FROM relayq_jobs WHERE id = ?")
                .bind(lease.job.0)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(at(until))
    }

    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, lease_token FROM relayq_jobs WHERE state = 'running' AND id IN (",
        );
        let mut ids = q.separated(", ");
        for l in leases {
            ids.push_bind(l.job.0);
        }
        q.push(")");
        let held: Vec<(i64, Option<Vec<u8>>)> = q
            .build_query_as()
            .fetch_all(&self.inner.pool)
            .await
            .map_err(db)?;
        let mut lost: Vec<JobId> = leases
            .iter()
            .filter(|l| {
                !held.iter().any(|(id, token)| {
                    *id == l.job.0 && token.as_deref() == Some(l.token.0.as_bytes().as_slice())
                })
            })
            .map(|l| l.job)
            .collect();
        lost.dedup();
        Ok(lost)
    }

    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.beat(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let mut refused = Vec::new();
        for r in reports {
            let written = sqlx::query(
                "UPDATE relayq_jobs SET progress = ?
                 WHERE id = ? AND lease_token = ? AND state = 'running'",
            )
            .bind(r.stored())
            .bind(r.lease.job.0)
            .bind(r.lease.token.0.as_bytes().as_slice())
            .execute(&self.inner.pool)
            .await
            .map_err(db)?
            .rows_affected();
            // A report equal to the stored one changes no row: look again.
            if written == 0 && !holds(self, &r.lease).await? {
                refused.push(r.lease.job);
            }
        }
        Ok(refused)
    }
}

/// Whether `lease` still holds its job (running, same token).
async fn holds(b: &MysqlBackend, lease: &Lease) -> Result<bool> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM relayq_jobs WHERE id = ? AND lease_token = ? AND state = 'running'",
    )
    .bind(lease.job.0)
    .bind(lease.token.0.as_bytes().as_slice())
    .fetch_optional(&b.inner.pool)
    .await
    .map_err(db)?;
    Ok(found.is_some())
}

/// One settle, in the order given: a dead job may halt its batch at once (SPEC B6), so
/// that a later settle of the same call finds its job cancelled.
async fn settle_one(
    c: &mut Conn,
    s: &Settle,
    now: i64,
    touched: &mut promote::Touched,
) -> Result<Result<Settled>> {
    let row: Option<Held> = sqlx::query_as(HELD)
        .bind(s.lease.job.0)
        .bind(s.lease.token.0.as_bytes().as_slice())
        .bind(now)
        .bind(&s.lease.queue)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let Some((attempts, max_attempts, budget, run_at, group, batch, stage, worker, started, key)) =
        row
    else {
        return Ok(Err(Error::StaleLease));
    };
    let (state, run_at, attempts_after, finished_at, error, outcome, settled) = match &s.outcome {
        Outcome::Complete => (
            JobState::Succeeded,
            run_at,
            attempts,
            Some(now),
            None,
            AttemptOutcome::Succeeded,
            Settled::Completed,
        ),
        Outcome::Fail { error, retry } => {
            let retry_at = retry
                .delay(s.lease.attempt, at(now))
                .map(|d| plus(now, d))
                .filter(|_| attempts < max_attempts);
            match retry_at {
                Some(t) => (
                    JobState::Retrying,
                    t,
                    attempts,
                    None,
                    Some(error.as_str()),
                    AttemptOutcome::Failed,
                    Settled::Retrying { at: at(t) },
                ),
                None => (
                    JobState::Dead,
                    run_at,
                    attempts,
                    Some(now),
                    Some(error.as_str()),
                    AttemptOutcome::Failed,
                    Settled::Dead,
                ),
            }
        }
        Outcome::Release => {
            // A released attempt does not count; a job that had failed before stays
            // `retrying` (its first attempt was not this one).
            let first = 1 + max_attempts - budget.unwrap_or(max_attempts);
            let state = if attempts > first {
                JobState::Retrying
            } else {
                JobState::Ready
            };
            (
                state,
                run_at,
                attempts - 1,
                None,
                None,
                AttemptOutcome::Released,
                Settled::Released,
            )
        }
    };
    sqlx::query(SET_STATE)
        .bind(state.as_str())
        .bind(run_at)
        .bind(attempts_after)
        .bind(finished_at)
        .bind(error)
        .bind(s.lease.job.0)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    let ended = Ended {
        job: s.lease.job.0,
        attempt: attempts,
        worker: &worker,
        // The handler's start: the claim plus its wait in the worker (SPEC L5).
        started_at: started.saturating_add(s.waited_micros()).min(now),
        claimed_at: started,
        ended_at: now,
        outcome,
        error,
        output: s.output.as_deref(),
    };
    log_attempts(c, &[ended]).await?;
    // Its key's slot is free (SPEC K2).
    crate::keys::freed(c, &s.lease.queue, key.as_deref()).await?;
    if let (Settled::Released, Some(group), JobState::Ready) = (settled, group.as_deref(), state) {
        // A released job no longer holds its group: an earlier job of the group whose
        // stage was released meanwhile goes first (SPEC G2). A released retry holds it
        // still.
        touched.group(&s.lease.queue, group);
    }
    if matches!(state, JobState::Succeeded | JobState::Dead) {
        let f = promote::Finished {
            id: s.lease.job.0,
            queue: &s.lease.queue,
            group: group.as_deref(),
            batch,
            stage,
            state,
        };
        touched.finished(c, &f, now).await?;
    }
    Ok(Ok(settled))
}
