//! SPEC C: claims in one write transaction over the claim index.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::kit::keys::KeyAdmission;
use relayq_core::{
    AttemptOutcome, BatchId, Claim, ClaimRequest, ClaimedJob, Error, JobId, JobState, Lease,
    LeaseToken, Result,
};
use sqlx::{Row as _, sqlite::SqliteRow};
use std::collections::HashMap;

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
/// claim.rs): looking each column up by name and checking its type took about two
/// thirds of the decoder's instructions. Nothing checks the order at run time; a swap of two
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

/// The queue's settings: one probe of its primary key. A single-table equality on a
/// primary key or unique index, as here and in every `WHERE id = ?1` below, is
/// planned by SQLite's short cut for it, before and without the statistics.
pub(crate) const QUEUE_SETTINGS: &str = "SELECT paused, max_running,
        key_limit IS NOT NULL
        OR EXISTS (SELECT 1 FROM relayq_key_limits WHERE queue = ?1),
        rate_count, rate_per_us, rate_burst, rate_tat
    FROM relayq_queues WHERE queue = ?1";

/// The queue's rate's next start after a claim (`kit::rate`).
pub(crate) const RATE_TAT: &str = "UPDATE relayq_queues SET rate_tat = ?2 WHERE queue = ?1";

/// A queue's settings as [`QUEUE_SETTINGS`] reads them.
type Settings = (
    bool,
    Option<i64>,
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// The queue's running jobs, for `max_running`. Pinned to the running index, which
/// holds them and nothing else; `relayq_jobs_state` would do as well, but the pin
/// keeps the plan from depending on which of the two the statistics favour.
pub(crate) const RUNNING_COUNT: &str =
    "SELECT COUNT(*) FROM relayq_jobs INDEXED BY relayq_jobs_running
    WHERE queue = ?1 AND state = 'running'";

/// The claim, in one statement; the random token comes from SQLite's CSPRNG, one per
/// row.
///
/// An upsert, not `UPDATE ... WHERE id IN (SELECT ...)`. That form is
/// planned as either a look-up of each claimed id or a scan of `relayq_jobs` testing
/// each row against the list, whichever the statistics make cheaper. Analyzed while
/// the file held a few jobs (`sqlite_stat1` says ten rows) and then filled with
/// 50,000, it scanned the whole table on every claim: 364,514 virtual machine steps
/// for a claim of 100, against 14,700 (tests/statistics.rs). SQLite has no hint that
/// forbids a table scan but `INDEXED BY`, and the rowid is not an index. An
/// `INSERT ... ON CONFLICT (id) DO UPDATE` finds each row through the primary key's
/// conflict check, a seek the planner does not choose; the `SELECT` reads the claim
/// index, pinned by `INDEXED BY`, in order from the queue's head. The insert side
/// never runs: every id comes from the table, read in this statement under the write
/// lock, so each one conflicts (the `NOT NULL` columns are filled only to pass the
/// checks that come before the conflict's; the payload is left out, `X''`).
pub(crate) const CLAIM: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT id, queue, state, X'', priority, run_at, max_attempts, created_at
    FROM relayq_jobs INDEXED BY relayq_jobs_claim
    WHERE queue = ?4 AND state IN ('ready', 'retrying') AND parked = 0 AND run_at <= ?3
    ORDER BY priority, run_at, id LIMIT ?5
    ON CONFLICT (id) DO UPDATE
    SET state = 'running', attempts = attempts + 1, lease_token = randomblob(16),
        lease_expires_at = ?1, worker = ?2, started_at = ?3
    RETURNING id, lease_token, attempts, payload, priority, run_at, max_attempts,
              group_key, batch_id, stage, enqueued_by";

/// A keyed claim's candidates: the head of the claim index, with each job's key.
pub(crate) const CANDIDATES: &str =
    "SELECT id, limit_key FROM relayq_jobs INDEXED BY relayq_jobs_claim
    WHERE queue = ?1 AND state IN ('ready', 'retrying') AND parked = 0 AND run_at <= ?2
    ORDER BY priority, run_at, id LIMIT ?3";

/// Each key's limit (its own, else the queue's default) and running jobs, jobs held
/// ahead in a buffer included (SPEC K2), for the keys given as a JSON array: one
/// statement for a claim's new keys, where a pair of statements per key cost more than
/// their work (see `settle::complete_all`).
pub(crate) const KEY_INFO: &str = "SELECT l.value,
        COALESCE((SELECT max FROM relayq_key_limits WHERE queue = ?1 AND limit_key = l.value),
                 (SELECT key_limit FROM relayq_queues WHERE queue = ?1)),
        (SELECT COUNT(*) FROM relayq_jobs INDEXED BY relayq_jobs_key_running
         WHERE queue = ?1 AND limit_key = l.value AND limit_key IS NOT NULL
           AND state = 'running')
    FROM json_each(?2) AS l";

/// Sets the jobs given as a JSON array of ids aside until a slot of their key frees
/// (SPEC K4; the `relayq_key_freed` trigger puts them back one at a time). An upsert
/// that finds each row by its id, as [`CLAIM`] does.
pub(crate) const PARK: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at
    FROM json_each(?1) AS l CROSS JOIN relayq_jobs AS j ON j.id = l.value
    WHERE true
    ON CONFLICT (id) DO UPDATE SET parked = 1";

/// The jobs given as a JSON array of ids, claimed; the columns are [`CLAIM`]'s.
pub(crate) const CLAIM_IDS: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at
    FROM json_each(?4) AS l CROSS JOIN relayq_jobs AS j ON j.id = l.value
    WHERE true
    ON CONFLICT (id) DO UPDATE
    SET state = 'running', attempts = attempts + 1, lease_token = randomblob(16),
        lease_expires_at = ?1, worker = ?2, started_at = ?3
    RETURNING id, lease_token, attempts, payload, priority, run_at, max_attempts,
              group_key, batch_id, stage, enqueued_by";

/// How many candidates a keyed claim reads at a time, beyond its limit: enough to
/// pass over a full key's jobs, each of which it parks so the next read goes further.
const SCAN_EXTRA: i64 = 256;
/// How many candidates a keyed claim's first read takes beyond twice its limit.
const FIRST_EXTRA: i64 = 16;
/// Reads of candidates per keyed claim at most.
const SCAN_ROUNDS: usize = 8;

/// The queue's running jobs whose lease has expired, pinned to the running index
/// (see [`RUNNING_COUNT`]).
pub(crate) const EXPIRED: &str =
    "SELECT id, attempts, max_attempts, group_key, batch_id, stage, worker, started_at
    FROM relayq_jobs INDEXED BY relayq_jobs_running
    WHERE queue = ?1 AND state = 'running' AND lease_expires_at <= ?2";

/// One expired job, retrying or dead; not one that no longer runs (see [`expire`]).
pub(crate) const EXPIRE_ONE: &str =
    "UPDATE relayq_jobs SET state = ?2, last_error = ?3, finished_at = ?4,
        lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND state = 'running'";

#[async_trait]
impl Claim for SqliteBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<relayq_core::Claimed> {
        let (mut tx, now) = self.write().await?;
        expire(&mut tx, &req.queue, now).await?;
        let settings: Option<Settings> = sqlx::query_as(QUEUE_SETTINGS)
            .bind(&req.queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let (paused, max_running, keyed, count, per, burst, tat) =
            settings.unwrap_or((false, None, false, None, None, None, None));
        let mut limit = i64::from(req.limit);
        if let Some(max) = max_running {
            let running: i64 = sqlx::query_scalar(RUNNING_COUNT)
                .bind(&req.queue)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
            limit = limit.min(max - running);
        }
        if paused || limit <= 0 {
            tx.commit().await.map_err(db)?;
            return Ok(relayq_core::Claimed::default());
        }
        // SPEC K9: the write lock makes the rate's read and update one step.
        let paced = relayq_core::kit::rate::stored(count, per, burst).map(|rate| {
            let asked = u32::try_from(limit).unwrap_or(u32::MAX);
            relayq_core::kit::rate::admit(&rate, tat, now.timestamp_micros(), asked)
        });
        if let Some(p) = &paced {
            limit = i64::from(p.allowed);
        }
        let expires_at = plus(now, req.lease);
        let mut rows: Vec<Claimed> = if limit == 0 {
            Vec::new()
        } else if keyed {
            claim_keyed(&mut tx, &req, limit, expires_at, now).await?
        } else {
            sqlx::query_as(CLAIM)
                .bind(us(expires_at))
                .bind(&req.worker)
                .bind(us(now))
                .bind(&req.queue)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?
        };
        let taken = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let mut next_in = None;
        if let Some(p) = paced {
            if let Some(tat) = p.tat(taken) {
                sqlx::query(RATE_TAT)
                    .bind(&req.queue)
                    .bind(tat)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            next_in = p.next_in(taken);
        }
        tx.commit().await.map_err(db)?;
        // RETURNING has no order: sort by order key (SPEC C3).
        rows.sort_unstable_by_key(|r| (r.priority, r.run_at, r.id));
        let jobs = rows
            .into_iter()
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
            .collect::<Result<Vec<_>>>()?;
        Ok(relayq_core::Claimed::new(jobs, next_in))
    }
}

/// SPEC K2, K4, K6: the claim of a queue with key limits. Reads the claim index's head,
/// takes each job whose key has room, parks those whose key is full, and reads on past
/// them while it has room left. The write lock keeps the counts exact.
async fn claim_keyed(
    c: &mut Conn,
    req: &ClaimRequest,
    limit: i64,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<Claimed>> {
    let want = u32::try_from(limit).map_err(Error::backend)?;
    let mut admission = KeyAdmission::new(want, req.slots);
    let mut keys: HashMap<String, (Option<u32>, u64)> = HashMap::new();
    let mut rows = Vec::new();
    // The first read takes little beyond the claim's room: most claims find keys with
    // room there. Reads after one that parked go further.
    let mut scan = 2 * limit + FIRST_EXTRA;
    for _ in 0..SCAN_ROUNDS {
        let candidates: Vec<(i64, Option<String>)> = sqlx::query_as(CANDIDATES)
            .bind(&req.queue)
            .bind(us(now))
            .bind(scan)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let new: std::collections::BTreeSet<&str> = candidates
            .iter()
            .filter_map(|(_, k)| k.as_deref())
            .filter(|k| !keys.contains_key(*k))
            .collect();
        if !new.is_empty() {
            let found: Vec<(String, Option<i64>, i64)> = sqlx::query_as(KEY_INFO)
                .bind(&req.queue)
                .bind(serde_json::to_string(&new).map_err(Error::backend)?)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            for (k, max, running) in found {
                let max = max.and_then(|m| u32::try_from(m).ok());
                keys.insert(k, (max, running.unsigned_abs()));
            }
        }
        let (taken, parked) = admission.split(&candidates, &keys);
        if !parked.is_empty() {
            sqlx::query(PARK)
                .bind(serde_json::to_string(&parked).map_err(Error::backend)?)
                .execute(&mut *c)
                .await
                .map_err(db)?;
        }
        // Claimed now, so that the next read does not return them again.
        if !taken.is_empty() {
            let claimed: Vec<Claimed> = sqlx::query_as(CLAIM_IDS)
                .bind(us(expires_at))
                .bind(&req.worker)
                .bind(us(now))
                .bind(serde_json::to_string(&taken).map_err(Error::backend)?)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            rows.extend(claimed);
        }
        let read = i64::try_from(candidates.len()).unwrap_or(0);
        if admission.done() || read < scan || parked.is_empty() {
            break;
        }
        scan = 2 * limit + SCAN_EXTRA;
    }
    Ok(rows)
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
    let expired: Vec<Expired> = sqlx::query_as(EXPIRED)
        .bind(queue)
        .bind(us(now))
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let (mut requeued, mut dead) = (0, 0);
    let mut touched = promote::Touched::default();
    for e in expired {
        let error = "lease expired";
        let retry = e.attempts < e.max_attempts;
        let changed = sqlx::query(EXPIRE_ONE)
            .bind(e.id)
            .bind(if retry { "retrying" } else { "dead" })
            .bind(error)
            .bind(if retry { None } else { Some(us(now)) })
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
            job: e.id,
            attempt: e.attempts,
            worker: &e.worker,
            started_at: e.started_at,
            claimed_at: e.started_at,
            ended_at: now,
            outcome: AttemptOutcome::Expired,
            error: Some(error),
            output: None,
        };
        log_attempt(c, ended).await?;
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
