//! SPEC C: claims under the queue's shared lock: the head read plainly on the claim
//! index, its jobs locked by id `FOR UPDATE SKIP LOCKED`, then started in one `UPDATE`
//! by primary key; SPEC C5: expired leases.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use relayq_core::{
    AttemptOutcome, BatchId, Claim, ClaimRequest, ClaimedJob, Error, JobId, JobState, Lease,
    LeaseToken, Result, retry::retry_transient,
};
use sqlx::{MySql, QueryBuilder, Row as _, mysql::MySqlRow};

use crate::{Conn, Ended, MysqlBackend, at, db, deadlocked, log_attempts, plus, promote};

/// How often a handle looks for a queue's expired leases (SPEC C5 allows a few hundred
/// milliseconds): the look is a write under the queue's exclusive lock.
const EXPIRY_EVERY: Duration = Duration::from_millis(250);

/// The queue's head: claimable jobs in order-key order. The index's equality prefix
/// (`claim_queue`) holds only the queue's `ready` and `retrying` jobs and its order is
/// the claim's, so `LIMIT` stops the read early and nothing is sorted; `FORCE INDEX`
/// keeps stale statistics from choosing another plan. A plain read: a locking one
/// would also lock the entry past the queue's last, another queue's job, which that
/// queue's claims would then skip ([`TAKE`] locks by id).
const CANDIDATES: &str = "SELECT id FROM relayq_jobs FORCE INDEX (relayq_jobs_claim)
    WHERE claim_queue = ? AND run_at <= ?
    ORDER BY priority, run_at, id LIMIT ?";

/// The candidates still claimable, locked by primary key, skipping those another
/// claimer holds (SPEC C4); the `IN (...)` list follows.
const TAKE: &str = "SELECT id, attempts, payload, priority, run_at, max_attempts,
        CAST(group_key AS CHAR), batch_id, stage, CAST(enqueued_by AS CHAR)
    FROM relayq_jobs WHERE claim_queue = ";

/// Rounds of [`CANDIDATES`] and [`TAKE`] per claim at most: each round reads past the
/// jobs other claimers took meanwhile.
const TAKE_ROUNDS: usize = 3;

/// The queue's running jobs, for `max_running`.
const RUNNING_COUNT: &str = "SELECT COUNT(*) FROM relayq_jobs WHERE running_queue = ?";

/// Whether any lease of the queue expired: a plain read, so that a claim takes the
/// exclusive lock for expiry only when there is something to do. `NOW(6)` is constant
/// in the statement, so the index's range applies.
const ANY_EXPIRED: &str = "SELECT 1 FROM relayq_jobs
    WHERE running_queue = ?
      AND lease_expires_at <= CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
    LIMIT 1";

/// The queue's expired leases.
const EXPIRED: &str = "SELECT id, attempts, max_attempts, CAST(group_key AS CHAR), batch_id,
        stage, CAST(COALESCE(worker, '') AS CHAR), COALESCE(started_at, 0),
        CAST(limit_key AS CHAR)
    FROM relayq_jobs WHERE running_queue = ? AND lease_expires_at <= ?";

/// One expired lease ended: retried or dead; not one a heartbeat extended since it was
/// read.
const EXPIRE_ONE: &str = "UPDATE relayq_jobs SET state = ?, last_error = ?, finished_at = ?,
        lease_token = NULL, lease_expires_at = NULL
    WHERE id = ? AND state = 'running' AND lease_expires_at <= ?";

/// One row of [`CANDIDATES`], and the token it is started with.
pub(crate) struct Candidate {
    pub(crate) id: i64,
    token: uuid::Uuid,
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

impl sqlx::FromRow<'_, MySqlRow> for Candidate {
    fn from_row(row: &MySqlRow) -> sqlx::Result<Self> {
        Ok(Self {
            token: uuid::Uuid::nil(),
            id: row.try_get(0)?,
            attempts: row.try_get(1)?,
            payload: row.try_get(2)?,
            priority: row.try_get(3)?,
            run_at: row.try_get(4)?,
            max_attempts: row.try_get(5)?,
            group_key: row.try_get(6)?,
            batch_id: row.try_get(7)?,
            stage: row.try_get(8)?,
            enqueued_by: row.try_get(9)?,
        })
    }
}

#[async_trait]
impl Claim for MysqlBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<relayq_core::Claimed> {
        self.expire_due(&req.queue).await?;
        retry_transient(|| self.claim_once(&req), deadlocked).await
    }
}

impl MysqlBackend {
    async fn claim_once(&self, req: &ClaimRequest) -> Result<relayq_core::Claimed> {
        let Some((mut tx, now, queue)) = self.claim_lock(&req.queue).await? else {
            return Ok(relayq_core::Claimed::default());
        };
        let mut limit = i64::from(req.limit);
        if let Some(max) = queue.max_running {
            let running: i64 = sqlx::query_scalar(RUNNING_COUNT)
                .bind(&req.queue)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
            limit = limit.min(max - running);
        }
        if queue.paused || limit <= 0 {
            tx.commit().await.map_err(db)?;
            return Ok(relayq_core::Claimed::default());
        }
        // SPEC K9: the exclusive lock makes the rate's read and update one step.
        let paced = queue.rate.map(|rate| {
            let asked = u32::try_from(limit).unwrap_or(u32::MAX);
            relayq_core::kit::rate::admit(&rate, queue.tat, now, asked)
        });
        if let Some(p) = &paced {
            limit = i64::from(p.allowed);
        }
        let mut wake_in = None;
        let rows: Vec<Candidate> = if limit == 0 {
            Vec::new()
        } else if queue.keyed {
            let (rows, wake) = crate::keys::claim_keyed(&mut tx, req, limit, now, &queue).await?;
            wake_in = wake;
            rows
        } else {
            let mut rows = take_head(&mut tx, &req.queue, limit, now).await?;
            start(&mut tx, &mut rows, req, now).await?;
            rows
        };
        let expires_at = plus(now, req.lease);
        let taken = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let mut next_in = None;
        if let Some(p) = paced {
            if let Some(tat) = p.tat(taken) {
                sqlx::query("UPDATE relayq_queues SET rate_tat = ? WHERE queue = ?")
                    .bind(tat)
                    .bind(&req.queue)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            next_in = p.next_in(taken);
        }
        tx.commit().await.map_err(db)?;
        let jobs = rows
            .into_iter()
            .map(|r| claimed(req, r, expires_at))
            .collect::<Result<Vec<_>>>()?;
        Ok(relayq_core::Claimed::new(jobs, next_in).waking_in(wake_in))
    }

    /// The server's plan for the claim's read of `queue`'s head (`EXPLAIN
    /// FORMAT=JSON`), for tests and for operators who want to see it on their data.
    ///
    /// # Errors
    /// A backend error.
    pub async fn explain_claim(&self, queue: &str, limit: u32) -> Result<String> {
        let sql = format!("EXPLAIN FORMAT=JSON {CANDIDATES}");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(queue)
            .bind(i64::MAX)
            .bind(i64::from(limit))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(db)
    }

    /// Ends the queue's expired leases (SPEC C5), at most every [`EXPIRY_EVERY`] per
    /// queue and handle, and only when a plain read finds one.
    async fn expire_due(&self, queue: &str) -> Result<()> {
        {
            let mut last = self
                .inner
                .expiry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            match last.get(queue) {
                Some(t) if now.duration_since(*t) < EXPIRY_EVERY => return Ok(()),
                _ => {
                    last.insert(queue.to_owned(), now);
                }
            }
        }
        let any: Option<i32> = sqlx::query_scalar(ANY_EXPIRED)
            .bind(queue)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(db)?;
        if any.is_none() {
            return Ok(());
        }
        retry_transient(
            || async {
                let (mut tx, now) = self.write(&[queue]).await?;
                expire(&mut tx, queue, now).await?;
                tx.commit().await.map_err(db)
            },
            deadlocked,
        )
        .await
    }
}

/// Up to `limit` of the queue's claimable jobs in order-key order, each locked: the
/// head read plainly, then its jobs locked by id, skipping those another claimer holds
/// (SPEC C3, C4). A round that came back short reads past what it found.
async fn take_head(c: &mut Conn, queue: &str, limit: i64, now: i64) -> Result<Vec<Candidate>> {
    let mut taken: Vec<Candidate> = Vec::new();
    let mut seen = 0;
    for _ in 0..TAKE_ROUNDS {
        let want = limit - i64::try_from(taken.len()).unwrap_or(0);
        let head: Vec<i64> = sqlx::query_scalar(CANDIDATES)
            .bind(queue)
            .bind(now)
            .bind(seen + want)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let fresh: Vec<i64> = head
            .iter()
            .copied()
            .skip(usize::try_from(seen).unwrap_or(0))
            .collect();
        if fresh.is_empty() {
            break;
        }
        let mut q = QueryBuilder::<MySql>::new(TAKE);
        q.push_bind(queue)
            .push(" AND run_at <= ")
            .push_bind(now)
            .push(" AND id IN (");
        let mut list = q.separated(", ");
        for id in &fresh {
            list.push_bind(*id);
        }
        list.push_unseparated(") FOR UPDATE SKIP LOCKED");
        let rows: Vec<Candidate> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
        let got = rows.len();
        taken.extend(rows);
        seen = i64::try_from(head.len()).unwrap_or(i64::MAX);
        if i64::try_from(taken.len()).unwrap_or(0) >= limit || got == fresh.len() {
            break;
        }
    }
    taken.sort_unstable_by_key(|r| (r.priority, r.run_at, r.id));
    Ok(taken)
}

/// Starts the attempts of `rows`, read under the claim's locks: each running under a
/// new random token (kept in the row), by primary key. Nothing for no rows.
pub(crate) async fn start(
    c: &mut Conn,
    rows: &mut [Candidate],
    req: &ClaimRequest,
    now: i64,
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    for r in rows.iter_mut() {
        r.token = uuid::Uuid::new_v4();
    }
    let mut q = QueryBuilder::<MySql>::new(
        "UPDATE relayq_jobs SET state = 'running', attempts = attempts + 1, lease_expires_at = ",
    );
    q.push_bind(plus(now, req.lease))
        .push(", worker = ")
        .push_bind(&req.worker)
        .push(", started_at = ")
        .push_bind(now)
        .push(", lease_token = CASE id");
    for r in rows.iter() {
        q.push(" WHEN ")
            .push_bind(r.id)
            .push(" THEN ")
            .push_bind(r.token.as_bytes().to_vec());
    }
    q.push(" END WHERE id IN (");
    let mut ids = q.separated(", ");
    for r in rows.iter() {
        ids.push_bind(r.id);
    }
    q.push(")");
    let done = q.build().execute(&mut *c).await.map_err(db)?;
    if done.rows_affected() != rows.len() as u64 {
        return Err(Error::backend("a claim started a different count of jobs"));
    }
    Ok(())
}

fn claimed(req: &ClaimRequest, r: Candidate, expires_at: i64) -> Result<ClaimedJob> {
    Ok(ClaimedJob {
        lease: Lease {
            queue: req.queue.clone(),
            job: JobId(r.id),
            token: LeaseToken(r.token),
            attempt: u32::try_from(r.attempts + 1).map_err(Error::backend)?,
            expires_at: at(expires_at),
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
}

type Expired = (
    i64,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
    String,
    i64,
    Option<String>,
);

/// Ends the queue's expired leases inside a transaction holding its exclusive lock:
/// a job with attempts left is retried, others are dead (SPEC C5), each attempt
/// logged as expired, and what a dead one releases promoted. Returns (retried, dead).
pub(crate) async fn expire(c: &mut Conn, queue: &str, now: i64) -> Result<(u64, u64)> {
    let expired: Vec<Expired> = sqlx::query_as(EXPIRED)
        .bind(queue)
        .bind(now)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let (mut requeued, mut dead) = (0, 0);
    let mut touched = promote::Touched::default();
    let error = "lease expired";
    for (id, attempts, max_attempts, group, batch, stage, worker, started_at, key) in expired {
        let retry = attempts < max_attempts;
        let changed = sqlx::query(EXPIRE_ONE)
            .bind(if retry { "retrying" } else { "dead" })
            .bind(error)
            .bind(if retry { None } else { Some(now) })
            .bind(id)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
        // A job dead earlier in this pass may have halted its batch, cancelling this
        // one (its attempt logged then): it stays cancelled (SPEC B6).
        if changed == 0 {
            continue;
        }
        let ended = Ended {
            job: id,
            attempt: attempts,
            worker: &worker,
            started_at,
            claimed_at: started_at,
            ended_at: now,
            outcome: AttemptOutcome::Expired,
            error: Some(error),
            output: None,
        };
        log_attempts(c, &[ended]).await?;
        crate::keys::freed(c, queue, key.as_deref()).await?;
        if retry {
            requeued += 1;
        } else {
            dead += 1;
            let finished = promote::Finished {
                id,
                queue,
                group: group.as_deref(),
                batch,
                stage,
                state: JobState::Dead,
            };
            touched.finished(c, &finished, now).await?;
        }
    }
    touched.promote(c).await?;
    Ok((requeued, dead))
}
