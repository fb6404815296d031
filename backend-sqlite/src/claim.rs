//! SPEC C: claims in one write transaction over the claim index.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, BatchId, Claim, ClaimRequest, ClaimedJob, Error, JobId, JobState, Lease,
    LeaseToken, Result, validate,
};
use sqlx::{Row as _, sqlite::SqliteRow};

use crate::{Conn, Ended, SqliteBackend, at, db, log_attempt, plus, promote, us};

/// One row of the claim's `RETURNING`.
struct Claimed {
    id: i64,
    lease_token: Vec<u8>,
    attempts: i64,
    payload: Vec<u8>,
    priority: i64,
    run_at: i64,
    max_attempts: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    enqueued_by: Option<String>,
}

/// By position, in the order of the claim's `RETURNING`, and without sqlx's check of
/// each column's type, as PostgreSQL's claim decodes (see `Row` in relayq-postgres's
/// claim.rs, and Findings 34). Nothing checks the order at run time; a swap of two
/// columns failed the conformance suite (its case c1 checks every claimed field).
impl sqlx::FromRow<'_, SqliteRow> for Claimed {
    fn from_row(row: &SqliteRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get_unchecked(0)?,
            lease_token: row.try_get_unchecked(1)?,
            attempts: row.try_get_unchecked(2)?,
            payload: row.try_get_unchecked(3)?,
            priority: row.try_get_unchecked(4)?,
            run_at: row.try_get_unchecked(5)?,
            max_attempts: row.try_get_unchecked(6)?,
            group_key: row.try_get_unchecked(7)?,
            batch_id: row.try_get_unchecked(8)?,
            stage: row.try_get_unchecked(9)?,
            enqueued_by: row.try_get_unchecked(10)?,
        })
    }
}

#[async_trait]
impl Claim for SqliteBackend {
    async fn claim(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        validate::claim(&req)?;
        let (mut tx, now) = self.write().await?;
        expire(&mut tx, &req.queue, now).await?;
        let settings: Option<(bool, Option<i64>)> =
            sqlx::query_as("SELECT paused, max_running FROM relayq_queues WHERE queue = ?1")
                .bind(&req.queue)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        let (paused, max_running) = settings.unwrap_or((false, None));
        let mut limit = i64::from(req.limit);
        if let Some(max) = max_running {
            let running: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM relayq_jobs WHERE queue = ?1 AND state = 'running'",
            )
            .bind(&req.queue)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            limit = limit.min(max - running);
        }
        if paused || limit <= 0 {
            tx.commit().await.map_err(db)?;
            return Ok(Vec::new());
        }
        let expires_at = plus(now, req.lease);
        // One statement; the random token comes from SQLite's CSPRNG, one per row.
        let mut rows: Vec<Claimed> = sqlx::query_as(
            "UPDATE relayq_jobs
             SET state = 'running', attempts = attempts + 1, lease_token = randomblob(16),
                 lease_expires_at = ?1, worker = ?2, started_at = ?3
             WHERE id IN (
                 SELECT id FROM relayq_jobs
                 WHERE queue = ?4 AND state IN ('ready', 'retrying') AND run_at <= ?3
                 ORDER BY priority, run_at, id LIMIT ?5)
             RETURNING id, lease_token, attempts, payload, priority, run_at, max_attempts,
                       group_key, batch_id, stage, enqueued_by",
        )
        .bind(us(expires_at))
        .bind(&req.worker)
        .bind(us(now))
        .bind(&req.queue)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        // RETURNING has no order: sort by order key (SPEC C3).
        rows.sort_unstable_by_key(|r| (r.priority, r.run_at, r.id));
        rows.into_iter()
            .map(|r| {
                let token = uuid::Uuid::from_slice(&r.lease_token).map_err(Error::backend)?;
                Ok(ClaimedJob {
                    lease: Lease {
                        queue: req.queue.clone(),
                        job: JobId(r.id),
                        token: LeaseToken(token),
                        attempt: u32::try_from(r.attempts).map_err(Error::backend)?,
                        expires_at,
                        worker: req.worker.clone(),
                    },
                    payload: r.payload,
                    priority: i16::try_from(r.priority).map_err(Error::backend)?,
                    run_at: at(r.run_at),
                    max_attempts: u16::try_from(r.max_attempts).map_err(Error::backend)?,
                    group: r.group_key,
                    batch: r.batch_id.map(BatchId),
                    stage: r
                        .stage
                        .map(i32::try_from)
                        .transpose()
                        .map_err(Error::backend)?,
                    enqueued_by: r.enqueued_by,
                })
            })
            .collect()
    }
}

#[derive(sqlx::FromRow)]
struct Expired {
    id: i64,
    attempts: i64,
    max_attempts: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    worker: String,
    started_at: i64,
}

/// SPEC C5: running jobs whose lease expired retry in place (keeping group and stage)
/// or, out of attempts, are dead. Returns (requeued, dead).
pub(crate) async fn expire(c: &mut Conn, queue: &str, now: DateTime<Utc>) -> Result<(u64, u64)> {
    let expired: Vec<Expired> = sqlx::query_as(
        "SELECT id, attempts, max_attempts, group_key, batch_id, stage, worker, started_at
         FROM relayq_jobs WHERE queue = ?1 AND state = 'running' AND lease_expires_at <= ?2",
    )
    .bind(queue)
    .bind(us(now))
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let (mut requeued, mut dead) = (0, 0);
    let mut touched = promote::Touched::default();
    for e in expired {
        let error = "lease expired";
        let ended = Ended {
            job: e.id,
            attempt: e.attempts,
            worker: &e.worker,
            started_at: e.started_at,
            ended_at: now,
            outcome: AttemptOutcome::Expired,
            error: Some(error),
            output: None,
        };
        log_attempt(c, ended).await?;
        let retry = e.attempts < e.max_attempts;
        sqlx::query(
            "UPDATE relayq_jobs SET state = ?2, last_error = ?3, finished_at = ?4,
                 lease_token = NULL, lease_expires_at = NULL
             WHERE id = ?1",
        )
        .bind(e.id)
        .bind(if retry { "retrying" } else { "dead" })
        .bind(error)
        .bind(if retry { None } else { Some(us(now)) })
        .execute(&mut *c)
        .await
        .map_err(db)?;
        if retry {
            requeued += 1;
        } else {
            dead += 1;
            let finished = promote::Finished {
                queue,
                group: e.group_key.as_deref(),
                batch: e.batch_id,
                stage: e.stage,
                state: JobState::Dead,
            };
            touched.finished(c, &finished, now).await?;
        }
    }
    touched.promote(c).await?;
    Ok((requeued, dead))
}
