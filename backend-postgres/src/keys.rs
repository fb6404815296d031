//! SPEC K: the claim of a queue with key limits, under the queue row's lock.
//!
//! It reads the claim index's head, takes each job whose key has room, parks those
//! whose key is full (they leave the claim index; the `key_freed` trigger of migration
//! 0012 puts one back each time a slot of the key frees), and reads on past them while
//! it has room left. The counts are exact because every keyed claim of the queue holds
//! the queue row `FOR UPDATE`, and each statement after the lock sees what the claims
//! and settles before it committed.
//!
//! Keys with rates (SPEC K12, K13) are judged at one clock reading taken after the
//! lock, which their jobs start at. A claim that finds a key's rate spent parks its
//! jobs and gives the key a wake time; the first claim after that time puts back up to
//! the rate's burst of them.

use chrono::{DateTime, Utc};
use relayq_core::{
    ClaimRequest, Error, Rate, Result,
    kit::keys::{KeyAdmission, KeyInfo},
};
use sqlx::PgConnection;
use std::collections::HashMap;

use crate::{
    PostgresBackend,
    claim::{Found, Row, to_found, tokens},
    db, micros,
};

/// The head of the claim index with each job's key, locked as a claim locks it. The
/// rows are found by primary key from the ids `claim_ready` gives (`id = ANY
/// (ARRAY(...))`), never by a join: a join was planned from the table's statistics,
/// and after `ANALYZE` of an empty table it read the whole table once per candidate
/// (17 million rows for a claim of 10, `tests/statistics.rs`).
const CANDIDATES: &str = "SELECT j.id, j.limit_key FROM {s}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM {s}.claim_ready($1, $2)))
    ORDER BY j.priority, j.run_at, j.id";

/// Each key's limit (its own, else the queue's default) and running jobs, jobs held
/// ahead in a buffer included (SPEC K2).
const KEY_INFO: &str = "SELECT k,
        COALESCE((SELECT max FROM {s}.key_limits WHERE queue = $1 AND limit_key = k),
                 (SELECT key_limit FROM {s}.queues WHERE queue = $1)),
        (SELECT count(*) FROM {s}.jobs
         WHERE queue = $1 AND limit_key = k AND limit_key IS NOT NULL AND state = 'running')
    FROM unnest($2::text[]) AS k";

/// Sets jobs aside until a slot of their key frees (SPEC K4).
const PARK: &str = "UPDATE {s}.jobs SET parked = true WHERE id = ANY($1)";

/// The chosen jobs, by id (ascending in `$1`: each takes the token at its place), in
/// the columns of the claim statement's final `SELECT`. Timed by the clock, not by
/// `now()`: the transaction began before its wait for the queue's lock, and the
/// claim, its lease and its log start when the jobs are taken. A queue with a rate
/// gives the time its rate was judged at instead (`$5`), so its starts are the ones
/// the rate counted (SPEC K9).
const CLAIM_IDS: &str = "WITH t AS MATERIALIZED (
        SELECT COALESCE($5::timestamptz, clock_timestamp()) AS at),
    claimed AS (
        UPDATE {s}.jobs j
        SET state = 'running', attempts = j.attempts + 1,
            lease_token = ($4::uuid[])[width_bucket(j.id, $1::bigint[])],
            lease_expires_at = (SELECT at FROM t) + $2::float8 * interval '1 microsecond',
            worker = $3, started_at = (SELECT at FROM t)
        WHERE j.id = ANY($1)
        RETURNING j.id, j.lease_token, j.attempts, j.payload, j.priority, j.run_at,
                  j.max_attempts, j.group_key, j.batch_id, j.stage, j.enqueued_by,
                  j.lease_expires_at)
    SELECT 0, false, *, NULL::bigint FROM claimed";

/// The own rate and state of each key given that has a row (SPEC K12).
const KEY_RATES: &str = "SELECT r.limit_key, r.rate_count, r.rate_per_us, r.rate_burst, r.tat
    FROM {s}.key_rates r
    WHERE r.queue = $1 AND r.limit_key = ANY($2::text[])";

/// The keys whose wake time has come, their wake time cleared (SPEC K13).
const WOKEN: &str = "UPDATE {s}.key_rates SET wake_at = NULL
    WHERE queue = $1 AND wake_at <= $2
    RETURNING limit_key, rate_count, rate_per_us, rate_burst, tat";

/// Puts back up to `$3` of a key's earliest parked jobs.
const UNPARK_FIRST: &str = "UPDATE {s}.jobs SET parked = false
    WHERE id = ANY (ARRAY(
        SELECT p.id FROM {s}.jobs p
        WHERE p.queue = $1 AND p.limit_key = $2 AND p.parked
          AND p.state IN ('ready', 'retrying')
        ORDER BY p.priority, p.run_at, p.id LIMIT $3))";

/// Keys' rates moved on by a claim (the new value, where it started jobs) and the
/// times their parked jobs go back (where it parked some for the rate).
const KEY_RATES_MOVED: &str = "INSERT INTO {s}.key_rates AS r (queue, limit_key, tat, wake_at)
    SELECT $1, k, t, w FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(k, t, w)
    ON CONFLICT (queue, limit_key) DO UPDATE
    SET tat = COALESCE(EXCLUDED.tat, r.tat), wake_at = COALESCE(EXCLUDED.wake_at, r.wake_at)";

/// A woken key that still has parked jobs and no wake time gets one.
const STILL_PARKED: &str = "UPDATE {s}.key_rates r SET wake_at = $3
    WHERE r.queue = $1 AND r.limit_key = $2 AND r.wake_at IS NULL
      AND EXISTS (SELECT 1 FROM {s}.jobs p
                  WHERE p.queue = $1 AND p.limit_key = $2 AND p.parked
                    AND p.state IN ('ready', 'retrying'))";

/// The earliest wake time of the queue's keys.
const NEXT_WAKE: &str = "SELECT min(wake_at) FROM {s}.key_rates
    WHERE queue = $1 AND wake_at IS NOT NULL";

/// A keyed claim's view of its queue's key rates: the default of every key without its
/// own.
pub(crate) struct KeyRates {
    pub(crate) default: Option<Rate>,
}

/// A key's row in `key_rates`: its own rate, if any, and its value.
type StoredKeyRate = (String, Option<i32>, Option<i64>, Option<i32>, Option<i64>);

fn rate_of(k: &StoredKeyRate, default: Option<Rate>) -> Option<Rate> {
    crate::inspect::stored_rate(k.1, k.2, k.3).or(default)
}

/// How many candidates a read takes beyond the claim's limit: enough to pass over a
/// full key's jobs, each of which it parks, so the next read goes further.
const SCAN_EXTRA: i64 = 256;
/// How many candidates a claim's first read takes beyond twice its limit.
const FIRST_EXTRA: i64 = 16;
/// Reads of candidates per claim at most.
const SCAN_ROUNDS: usize = 8;

impl PostgresBackend {
    /// Claims up to `limit` jobs of a keyed queue; the caller holds the queue row's lock.
    /// With key rates, `at` is the time the claim judges them at and starts its jobs at.
    pub(crate) async fn claim_keyed(
        &self,
        c: &mut PgConnection,
        req: &ClaimRequest,
        limit: i64,
        at: Option<DateTime<Utc>>,
        rates: Option<KeyRates>,
    ) -> Result<Found> {
        let now_us = at.unwrap_or_else(Utc::now).timestamp_micros();
        let woken: Vec<StoredKeyRate> = match &rates {
            Some(r) => self.wake(c, &req.queue, now_us, r.default).await?,
            None => Vec::new(),
        };
        let want = u32::try_from(limit).map_err(Error::backend)?;
        let mut admission = KeyAdmission::new(want, req.slots).at(now_us);
        let mut keys: HashMap<String, KeyInfo> = HashMap::new();
        let mut rows: Vec<Row> = Vec::new();
        // The first read takes little beyond the claim's room: most claims find keys
        // with room there. Reads after one that parked go further.
        let mut scan = 2 * limit + FIRST_EXTRA;
        for _ in 0..SCAN_ROUNDS {
            let candidates: Vec<(i64, Option<String>)> = sqlx::query_as(self.sql(CANDIDATES))
                .bind(&req.queue)
                .bind(scan)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            let mut new: Vec<&str> = candidates
                .iter()
                .filter_map(|(_, k)| k.as_deref())
                .filter(|k| !keys.contains_key(*k))
                .collect();
            new.sort_unstable();
            new.dedup();
            if !new.is_empty() {
                let found: Vec<(String, Option<i32>, i64)> = sqlx::query_as(self.sql(KEY_INFO))
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
                    for k in &new {
                        keys.entry((*k).to_owned()).or_default().rate = r.default;
                    }
                    let found: Vec<StoredKeyRate> = sqlx::query_as(self.sql(KEY_RATES))
                        .bind(&req.queue)
                        .bind(&new)
                        .fetch_all(&mut *c)
                        .await
                        .map_err(db)?;
                    for k in found {
                        let info = keys.entry(k.0.clone()).or_default();
                        info.rate = rate_of(&k, r.default);
                        info.tat = k.4;
                    }
                }
            }
            let (mut round_taken, parked) = admission.split(&candidates, &keys);
            if !parked.is_empty() {
                sqlx::query(self.sql(PARK))
                    .bind(&parked)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
            }
            // Claimed now, so that the next read does not return them again.
            if !round_taken.is_empty() {
                rows.extend(self.claim_ids(c, req, &mut round_taken, at).await?);
            }
            let read = i64::try_from(candidates.len()).unwrap_or(0);
            if admission.done() || read < scan || parked.is_empty() {
                break;
            }
            scan = 2 * limit + SCAN_EXTRA;
        }
        let short = rows.len() < usize::try_from(limit).unwrap_or(usize::MAX);
        let mut found = to_found(req, rows)?;
        if let Some(r) = rates {
            found.wake_in = self
                .keep_rates(c, &req.queue, &admission, &woken, r.default, now_us, short)
                .await?;
        }
        Ok(found)
    }

    /// SPEC K13: for each key whose wake time has come, clears it and puts back up to
    /// its rate's burst of its earliest parked jobs, as many as the rate can allow at
    /// once; returns those keys.
    async fn wake(
        &self,
        c: &mut PgConnection,
        queue: &str,
        now_us: i64,
        default: Option<Rate>,
    ) -> Result<Vec<StoredKeyRate>> {
        let woken: Vec<StoredKeyRate> = sqlx::query_as(self.sql(WOKEN))
            .bind(queue)
            .bind(now_us)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        for k in &woken {
            let burst = rate_of(k, default).map_or(1, |r| i64::from(r.burst));
            sqlx::query(self.sql(UNPARK_FIRST))
                .bind(queue)
                .bind(&k.0)
                .bind(burst)
                .execute(&mut *c)
                .await
                .map_err(db)?;
        }
        Ok(woken)
    }

    /// Stores what the claim changed of its keys' rates, gives a woken key whose jobs
    /// are still parked its next wake time, and, for a short claim, returns the wait
    /// until the earliest wake.
    #[allow(clippy::too_many_arguments)]
    async fn keep_rates(
        &self,
        c: &mut PgConnection,
        queue: &str,
        admission: &KeyAdmission,
        woken: &[StoredKeyRate],
        default: Option<Rate>,
        now_us: i64,
        short: bool,
    ) -> Result<Option<std::time::Duration>> {
        let changes = admission.rated();
        if !changes.is_empty() {
            let keys: Vec<&str> = changes.iter().map(|ch| ch.key.as_str()).collect();
            let tats: Vec<Option<i64>> = changes.iter().map(|ch| ch.tat).collect();
            let wakes: Vec<Option<i64>> = changes.iter().map(|ch| ch.wake).collect();
            sqlx::query(self.sql(KEY_RATES_MOVED))
                .bind(queue)
                .bind(&keys)
                .bind(&tats)
                .bind(&wakes)
                .execute(&mut *c)
                .await
                .map_err(db)?;
        }
        // A woken key's jobs beyond those put back stay parked until its next wake.
        for k in woken {
            let Some(at) = rate_of(k, default).and_then(|r| admission.wake_again(&k.0, &r, k.4))
            else {
                continue;
            };
            sqlx::query(self.sql(STILL_PARKED))
                .bind(queue)
                .bind(&k.0)
                .bind(at)
                .execute(&mut *c)
                .await
                .map_err(db)?;
        }
        if !short {
            return Ok(None);
        }
        let next: Option<i64> = sqlx::query_scalar(self.sql(NEXT_WAKE))
            .bind(queue)
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
        Ok(next.map(|at| std::time::Duration::from_micros((at - now_us).max(0).unsigned_abs())))
    }

    async fn claim_ids(
        &self,
        c: &mut PgConnection,
        req: &ClaimRequest,
        ids: &mut [i64],
        at: Option<DateTime<Utc>>,
    ) -> Result<Vec<Row>> {
        ids.sort_unstable();
        let n = i64::try_from(ids.len()).map_err(Error::backend)?;
        sqlx::query_as(self.sql(CLAIM_IDS))
            .bind(&*ids)
            .bind(micros(req.lease))
            .bind(&req.worker)
            .bind(tokens(n))
            .bind(at)
            .fetch_all(&mut *c)
            .await
            .map_err(db)
    }
}
