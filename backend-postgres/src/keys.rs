//! SPEC K: the claim of a queue with key limits, under the queue row's lock.
//!
//! It reads the claim index's head, takes each job whose key has room, parks those
//! whose key is full (they leave the claim index; the `key_freed` trigger of migration
//! 0012 puts one back each time a slot of the key frees), and reads on past them while
//! it has room left. The counts are exact because every keyed claim of the queue holds
//! the queue row `FOR UPDATE`, and each statement after the lock sees what the claims
//! and settles before it committed.

use chrono::{DateTime, Utc};
use relayq_core::{ClaimRequest, Error, Result, kit::keys::KeyAdmission};
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

/// How many candidates a read takes beyond the claim's limit: enough to pass over a
/// full key's jobs, each of which it parks, so the next read goes further.
const SCAN_EXTRA: i64 = 256;
/// How many candidates a claim's first read takes beyond twice its limit.
const FIRST_EXTRA: i64 = 16;
/// Reads of candidates per claim at most.
const SCAN_ROUNDS: usize = 8;

impl PostgresBackend {
    /// Claims up to `limit` jobs of a keyed queue; the caller holds the queue row's lock.
    pub(crate) async fn claim_keyed(
        &self,
        c: &mut PgConnection,
        req: &ClaimRequest,
        limit: i64,
        at: Option<DateTime<Utc>>,
    ) -> Result<Found> {
        let want = u32::try_from(limit).map_err(Error::backend)?;
        let mut admission = KeyAdmission::new(want, req.slots);
        let mut keys: HashMap<String, (Option<u32>, u64)> = HashMap::new();
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
            let new: Vec<&str> = candidates
                .iter()
                .filter_map(|(_, k)| k.as_deref())
                .filter(|k| !keys.contains_key(*k))
                .collect();
            if !new.is_empty() {
                let rows: Vec<(String, Option<i32>, i64)> = sqlx::query_as(self.sql(KEY_INFO))
                    .bind(&req.queue)
                    .bind(&new)
                    .fetch_all(&mut *c)
                    .await
                    .map_err(db)?;
                for (k, max, running) in rows {
                    let max = max.and_then(|m| u32::try_from(m).ok());
                    keys.insert(k, (max, running.unsigned_abs()));
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
        to_found(req, rows)
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
