//! SPEC C: claims in one write transaction over the claim index.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::kit::keys::{KeyAdmission, KeyInfo};
use relayq_core::{
    AttemptOutcome, BatchId, Claim, ClaimRequest, ClaimedJob, Error, JobId, JobState, Lease,
    LeaseToken, Rate, Result,
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
        rate_count, rate_per_us, rate_burst, rate_tat,
        key_rate_count IS NOT NULL
        OR EXISTS (SELECT 1 FROM relayq_key_rates WHERE queue = ?1),
        key_rate_count, key_rate_per_us, key_rate_burst
    FROM relayq_queues WHERE queue = ?1";

/// The queue's rate's next start after a claim (`kit::rate`).
pub(crate) const RATE_TAT: &str = "UPDATE relayq_queues SET rate_tat = ?2 WHERE queue = ?1";

/// A queue's settings as [`QUEUE_SETTINGS`] reads them.
#[derive(Default)]
struct Settings {
    paused: bool,
    max_running: Option<i64>,
    keyed: bool,
    rate: Option<Rate>,
    tat: Option<i64>,
    key_rated: bool,
    key_rate: Option<Rate>,
}

impl sqlx::FromRow<'_, SqliteRow> for Settings {
    fn from_row(row: &SqliteRow) -> sqlx::Result<Self> {
        let rate = |at: usize| -> sqlx::Result<Option<Rate>> {
            Ok(relayq_core::kit::rate::stored(
                row.try_get(at)?,
                row.try_get(at + 1)?,
                row.try_get(at + 2)?,
            ))
        };
        Ok(Self {
            paused: row.try_get(0)?,
            max_running: row.try_get(1)?,
            keyed: row.try_get(2)?,
            rate: rate(3)?,
            tat: row.try_get(6)?,
            key_rated: row.try_get(7)?,
            key_rate: rate(8)?,
        })
    }
}

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

/// The own rate and state of each key given as a JSON array that has a row (SPEC K12).
pub(crate) const KEY_RATES: &str = "SELECT r.limit_key AS key, r.rate_count, r.rate_per_us,
        r.rate_burst, r.tat
    FROM json_each(?2) AS l CROSS JOIN relayq_key_rates AS r
        ON r.queue = ?1 AND r.limit_key = l.value";

/// The keys whose wake time has come (SPEC K13).
pub(crate) const WOKEN: &str = "SELECT limit_key AS key, rate_count, rate_per_us, rate_burst,
        tat
    FROM relayq_key_rates INDEXED BY relayq_key_rates_wake
    WHERE queue = ?1 AND wake_at <= ?2";

/// Puts back up to `?3` of a key's earliest parked jobs; an upsert that finds each row
/// by its id, as [`CLAIM`] does.
pub(crate) const UNPARK_FIRST: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT id, queue, state, X'', priority, run_at, max_attempts, created_at
    FROM relayq_jobs INDEXED BY relayq_jobs_parked
    WHERE queue = ?1 AND limit_key = ?2 AND parked = 1 AND state IN ('ready', 'retrying')
    ORDER BY priority, run_at, id LIMIT ?3
    ON CONFLICT (id) DO UPDATE SET parked = 0";

/// A woken key's wake time, cleared.
pub(crate) const WAKE_DONE: &str =
    "UPDATE relayq_key_rates SET wake_at = NULL WHERE queue = ?1 AND limit_key = ?2";

/// A key's rate moved on by a claim (`?3`, the new value, if it started jobs) and the
/// time its parked jobs go back (`?4`, if the claim parked some for its rate).
pub(crate) const KEY_RATE_MOVED: &str =
    "INSERT INTO relayq_key_rates (queue, limit_key, tat, wake_at) VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (queue, limit_key) DO UPDATE
    SET tat = COALESCE(?3, tat), wake_at = COALESCE(?4, wake_at)";

/// A woken key that still has parked jobs and no wake time gets one.
pub(crate) const STILL_PARKED: &str = "UPDATE relayq_key_rates SET wake_at = ?3
    WHERE queue = ?1 AND limit_key = ?2 AND wake_at IS NULL
      AND EXISTS (SELECT 1 FROM relayq_jobs INDEXED BY relayq_jobs_parked
                  WHERE queue = ?1 AND limit_key = ?2 AND parked = 1
                    AND state IN ('ready', 'retrying'))";

/// The earliest wake time of the queue's keys.
pub(crate) const NEXT_WAKE: &str = "SELECT MIN(wake_at)
    FROM relayq_key_rates INDEXED BY relayq_key_rates_wake
    WHERE queue = ?1 AND wake_at IS NOT NULL";

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
        let Settings {
            paused,
            max_running,
            keyed,
            rate,
            tat,
            key_rated,
            key_rate,
        } = settings.unwrap_or_default();
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
        let paced = rate.map(|rate| {
            let asked = u32::try_from(limit).unwrap_or(u32::MAX);
            relayq_core::kit::rate::admit(&rate, tat, now.timestamp_micros(), asked)
        });
        if let Some(p) = &paced {
            limit = i64::from(p.allowed);
        }
        // As stored (whole microseconds): the expiry the claimer sees is the one judged.
        let expires_at = at(us(plus(now, req.lease)));
        let mut wake_in = None;
        let mut rows: Vec<Claimed> = if limit == 0 {
            Vec::new()
        } else if keyed || key_rated {
            let rated = key_rated.then_some(KeyRates { default: key_rate });
            let (rows, wake) = claim_keyed(&mut tx, &req, limit, expires_at, now, rated).await?;
            wake_in = wake;
            rows
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
        Ok(relayq_core::Claimed::new(jobs, next_in).waking_in(wake_in))
    }
}

/// A keyed claim's view of its queue's key rates (SPEC K12): the default of every key
/// without its own.
struct KeyRates {
    default: Option<Rate>,
}

/// SPEC K2, K4, K6, K12, K13: the claim of a queue with key limits or key rates. First
/// puts back the jobs of keys whose rate allows a start again; then reads the claim
/// index's head, takes each job whose key has room and whose key's rate allows it,
/// parks the others, and reads on past them while it has room left. The write lock
/// keeps the counts and the rates exact. Returns the rows and, for a claim that came
/// back short with jobs held by their keys' rates, when the earliest of those keys
/// allows a start.
async fn claim_keyed(
    c: &mut Conn,
    req: &ClaimRequest,
    limit: i64,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
    rates: Option<KeyRates>,
) -> Result<(Vec<Claimed>, Option<std::time::Duration>)> {
    let now_us = us(now);
    let woken = match &rates {
        Some(r) => wake(c, &req.queue, now_us, r.default).await?,
        None => Vec::new(),
    };
    let want = u32::try_from(limit).map_err(Error::backend)?;
    let mut admission = KeyAdmission::new(want, req.slots).at(now_us);
    let mut keys: HashMap<String, KeyInfo> = HashMap::new();
    let mut rows = Vec::new();
    // The first read takes little beyond the claim's room: most claims find keys with
    // room there. Reads after one that parked go further.
    let mut scan = 2 * limit + FIRST_EXTRA;
    for _ in 0..SCAN_ROUNDS {
        let candidates: Vec<(i64, Option<String>)> = sqlx::query_as(CANDIDATES)
            .bind(&req.queue)
            .bind(now_us)
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
            let new_keys: Vec<String> = new.iter().map(|k| (*k).to_owned()).collect();
            let new = serde_json::to_string(&new).map_err(Error::backend)?;
            let found: Vec<(String, Option<i64>, i64)> = sqlx::query_as(KEY_INFO)
                .bind(&req.queue)
                .bind(&new)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            for (k, max, running) in found {
                let max = max.and_then(|m| u32::try_from(m).ok());
                keys.insert(k, KeyInfo::limited(max, running.unsigned_abs()));
            }
            if let Some(r) = &rates {
                // Each new key is under the default until its row says otherwise.
                for k in &new_keys {
                    keys.entry(k.clone()).or_default().rate = r.default;
                }
                let found: Vec<StoredKeyRate> = sqlx::query_as(KEY_RATES)
                    .bind(&req.queue)
                    .bind(&new)
                    .fetch_all(&mut *c)
                    .await
                    .map_err(db)?;
                for k in found {
                    let info = keys.entry(k.key.clone()).or_default();
                    info.rate = k.rate(r.default);
                    info.tat = k.tat;
                }
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
                .bind(now_us)
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
    let Some(rates) = rates else {
        return Ok((rows, None));
    };
    let changes = admission.rated();
    for change in &changes {
        sqlx::query(KEY_RATE_MOVED)
            .bind(&req.queue)
            .bind(&change.key)
            .bind(change.tat)
            .bind(change.wake)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    // A woken key's jobs beyond those put back stay parked until its next wake.
    for k in woken {
        let Some(at) = k
            .rate(rates.default)
            .and_then(|rate| admission.wake_again(&k.key, &rate, k.tat))
        else {
            continue;
        };
        sqlx::query(STILL_PARKED)
            .bind(&req.queue)
            .bind(&k.key)
            .bind(at)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    let short = rows.len() < usize::try_from(limit).unwrap_or(usize::MAX);
    let mut wake_in = None;
    if short {
        let next: Option<i64> = sqlx::query_scalar(NEXT_WAKE)
            .bind(&req.queue)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
        wake_in =
            next.map(|at| std::time::Duration::from_micros((at - now_us).max(0).unsigned_abs()));
    }
    Ok((rows, wake_in))
}

/// A key's row in `relayq_key_rates`: its own rate, if any, and its state.
#[derive(sqlx::FromRow)]
struct StoredKeyRate {
    key: String,
    rate_count: Option<i64>,
    rate_per_us: Option<i64>,
    rate_burst: Option<i64>,
    tat: Option<i64>,
}

impl StoredKeyRate {
    /// The rate in force: its own, else the queue's default.
    fn rate(&self, default: Option<Rate>) -> Option<Rate> {
        relayq_core::kit::rate::stored(self.rate_count, self.rate_per_us, self.rate_burst)
            .or(default)
    }
}

/// SPEC K13: for each key whose wake time has come, puts back up to its rate's burst
/// of its earliest parked jobs, as many as its rate can allow at once, and clears the
/// wake time; returns those keys.
async fn wake(
    c: &mut Conn,
    queue: &str,
    now_us: i64,
    default: Option<Rate>,
) -> Result<Vec<StoredKeyRate>> {
    let woken: Vec<StoredKeyRate> = sqlx::query_as(WOKEN)
        .bind(queue)
        .bind(now_us)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    for k in &woken {
        let burst = k.rate(default).map_or(1, |r| i64::from(r.burst));
        sqlx::query(UNPARK_FIRST)
            .bind(queue)
            .bind(&k.key)
            .bind(burst)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query(WAKE_DONE)
            .bind(queue)
            .bind(&k.key)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(woken)
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
                id: e.id,
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
