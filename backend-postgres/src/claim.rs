//! SPEC C: claims in one statement over the claim index.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    BatchId, Claim, ClaimRequest, ClaimedJob, Error, JobId, JobState, Lease, LeaseToken, Result,
    retry::retry_transient, validate,
};
use sqlx::{Row as _, postgres::PgRow};

use crate::{
    PostgresBackend, db,
    keys::KeyRates,
    micros,
    promote::{self, Touched, archive},
};

/// The claim statement; `$gate` is an extra condition on both candidate scans.
///
/// `ready` takes the earliest claimable jobs through `claim_ready` (migration 0004), a
/// function that locks them `FOR NO KEY UPDATE SKIP LOCKED` (SPEC C3, C4; not `FOR
/// UPDATE`, which a settle's witness lock would make them skip) under settings that
/// leave its planner one plan: the claim index read in order, stopping after the rows
/// it needs. A plain `ORDER BY ... LIMIT` let the planner choose otherwise: on a large
/// table without column statistics (before autoanalyze's first pass, or with
/// autovacuum off) it guessed a queue of three rows and read the whole queue through a
/// bitmap scan to sort it, on every claim (66 ms a claim at 50,000 jobs). The gate
/// comes first, so a gated claim never calls it.
/// `expired` takes running jobs whose lease ran out and that have attempts left
/// (SPEC C5), usually none, found through the running index. Both are
/// `MATERIALIZED`, so the `UPDATE` touches exactly the rows they locked (PostgreSQL
/// bug #15715). The inner limit of `expired` is a literal, `{limit}`, the request's limit rounded
/// up to a power of two, so that cached generic plans estimate it right (see
/// [`Schema::sql_limit`](crate::schema::Schema::sql_limit)) while a worker needs at
/// most 11 statements; the outer `LIMIT $2` stops the scan, so only the rows claimed
/// are locked. The expired attempts are closed in the log, and one extra row of flags
/// says whether the queue has a concurrency limit (the caller then claims under the
/// queue's lock) and whether expired jobs without attempts left wait to be made dead.
/// Each claimed job takes its lease token from `$6`, the `n`-th job the `n`-th: tokens
/// are drawn by the caller, since `gen_random_uuid()` on the server took about 5% of
/// its time in a drain (`perf`: OpenSSL's `RAND_bytes` per row).
/// When `$5` is true, the flags row also sets `synchronous_commit` to `off` for the
/// statement's transaction alone, so its commit does not wait for the WAL flush (see
/// [`Config::durable_claims`](crate::Config::durable_claims)); `CASE` calls it only then.
///
/// `EXPLAIN` after `ANALYZE` (PostgreSQL 15, custom plan for a limit of 50; costs and
/// the flag sub-plans trimmed). Every scan is an index scan that stops after the rows
/// it needs, the function's included (`tests/postgres.rs` counts its reads with and
/// without statistics); the generic plan has the same scans:
///
/// ```text
/// Nested Loop Left Join
///   CTE ready
///     ->  Result
///           One-Time Filter: (NOT $1)
///           ->  Nested Loop
///                 ->  Result
///                 ->  Function Scan on claim_ready r
///   CTE expired
///     ->  Limit  ->  Subquery Scan on l  ->  Limit  ->  LockRows  ->  Sort
///           ->  Index Scan using jobs_running on jobs
///                 Index Cond: ((queue = '...'::text) AND (lease_expires_at <= now()))
///   CTE c
///     ->  WindowAgg  ->  Limit  ->  Sort  ->  Append  ->  CTE Scan on ready, CTE Scan on expired
///   CTE claimed
///     ->  Update on jobs j
///           InitPlan (returns $7)  ->  CTE Scan on c
///           ->  Result  One-Time Filter: $9
///                 ->  Index Scan using jobs_pkey on jobs j
///                       Index Cond: (id = ANY ($7))
/// ```
///
/// (`tests/postgres.rs` checks the plan, generic and custom, after `ANALYZE`.)
///
/// **The claimed rows are found by key, whatever the statistics.** `claimed` updates
/// the rows whose ids `c` holds, given as an array (`id = ANY (ARRAY(...))`), and
/// joins nothing: each row's token is its place among the ids in ascending order
/// (`width_bucket`, a binary search; the tokens are all random, so any one-to-one
/// pairing does), and the expired attempts are logged from `expired`, which holds
/// what they were. Written as `UPDATE ... FROM c WHERE j.id = c.id`, the join was
/// planned from the table's estimated size: after a drained queue was analyzed
/// (`reltuples` zero, as autovacuum leaves it), the planner took `jobs` for a table
/// of one row and walked its whole primary key once per claim, joining each row to
/// `c`: a claim of 100 on a queue of 50,000 took 1,459 ms instead of about 1 ms.
/// `tests/statistics.rs` runs every hot statement in four states of the statistics
/// and counts the rows each reads. `EXISTS (SELECT 1 FROM c)` skips the update
/// outright when nothing was claimed (an idle poll), where a small table's plan could
/// otherwise read it whole.
macro_rules! claim_sql {
    ($head:expr, $source:expr, $gate:expr, $expiry:literal, $n:expr, $tail:expr, $wait:expr) => {
        concat!(
            $head,
            "ready AS MATERIALIZED (
                SELECT r.* FROM (",
            $source,
            $gate,
            "   ) g CROSS JOIN LATERAL {s}.claim_ready($1, g.lim) r),
            expired AS MATERIALIZED (SELECT * FROM (
                SELECT id, state, attempts, worker, started_at, priority, run_at FROM {s}.jobs
                WHERE queue = $1 AND state = 'running' AND lease_expires_at <= now()
                  AND attempts < max_attempts ",
            $expiry,
            $gate,
            "   ORDER BY priority, run_at, id LIMIT {limit}
                FOR NO KEY UPDATE SKIP LOCKED) l LIMIT ",
            $n,
            "),
            c AS MATERIALIZED (
                SELECT *, row_number() OVER () AS n FROM (
                    SELECT * FROM ready UNION ALL SELECT * FROM expired
                    ORDER BY priority, run_at, id LIMIT ",
            $n,
            ") u),
            claimed AS (
                UPDATE {s}.jobs j
                SET state = 'running', attempts = j.attempts + 1,
                    lease_token = ($6::uuid[])[
                        width_bucket(j.id, ARRAY(SELECT id FROM c ORDER BY id))],
                    lease_expires_at = now() + $3::float8 * interval '1 microsecond',
                    worker = $4, started_at = now(),
                    last_error = CASE WHEN j.state = 'running' THEN 'lease expired'
                                      ELSE j.last_error END
                WHERE j.id = ANY (ARRAY(SELECT id FROM c)) AND EXISTS (SELECT 1 FROM c)
                RETURNING j.id, j.lease_token, j.attempts, j.payload, j.priority, j.run_at,
                          j.max_attempts, j.group_key, j.batch_id, j.stage, j.enqueued_by,
                          j.lease_expires_at),
            logged AS (
                INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at,
                                          outcome, error, claimed_at)
                SELECT id, attempts, worker, started_at, now(), 'expired', 'lease expired',
                       started_at
                FROM expired WHERE id IN (SELECT id FROM c)),",
            $tail,
            "
            flags AS (
                SELECT CASE
                         WHEN EXISTS (SELECT 1 FROM settings
                                      WHERE NOT paused AND max_running IS NULL AND NOT keyed
                                        AND rate_count IS NOT NULL) THEN 2
                         WHEN EXISTS (SELECT 1 FROM settings
                                      WHERE NOT paused AND (max_running IS NOT NULL OR keyed
                                                            OR rate_count IS NOT NULL)) THEN 1
                         ELSE 0 END AS limited,
                       EXISTS (SELECT 1 FROM {s}.jobs
                               WHERE queue = $1 AND state = 'running'
                                 AND lease_expires_at <= now()
                                 AND attempts >= max_attempts ",
            $expiry,
            ") AS doomed,
                       CASE WHEN $5 THEN set_config('synchronous_commit', 'off', true)
                       END AS async)
            SELECT f.limited, f.doomed, c.id, c.lease_token, c.attempts, c.payload, c.priority,
                   c.run_at, c.max_attempts, c.group_key, c.batch_id, c.stage, c.enqueued_by,
                   c.lease_expires_at, ",
            $wait,
            "
            FROM flags f LEFT JOIN claimed c ON true"
        )
    };
}

/// The settings every claim statement reads first.
macro_rules! settings {
    () => {
        "WITH settings AS MATERIALIZED (
            SELECT paused, max_running, keyed, rate_count FROM {s}.queues WHERE queue = $1),"
    };
}

/// The claim of up to `$2` jobs.
macro_rules! up_to_limit {
    () => {
        "SELECT $2::bigint AS lim WHERE true "
    };
}

/// The gate of a claim for a queue with no limit and not paused.
macro_rules! free {
    () => {
        "AND NOT EXISTS (SELECT 1 FROM settings
                         WHERE paused OR max_running IS NOT NULL OR keyed
                               OR rate_count IS NOT NULL)"
    };
}

/// SPEC K9 in the claim statement of a queue whose only limit is a rate: the queue's row
/// locked (`FOR UPDATE`: a claim before this one that moved the rate on is waited for,
/// and its row's newest version read), then `kit::rate::admit`'s arithmetic at the
/// statement's `now()`, the time its jobs start at: `e` the emission interval, `base`
/// the later of the stored next start and now, `allowed` what the claim may take.
macro_rules! rated_head {
    () => {
        "WITH settings AS MATERIALIZED (
            SELECT paused, max_running, keyed, rate_count, rate_per_us, rate_burst, rate_tat,
                   (extract(epoch FROM now()) * 1000000)::bigint AS now_us
            FROM {s}.queues WHERE queue = $1 FOR UPDATE),
        rated AS MATERIALIZED (
            SELECT now_us, e, base, rate_burst AS burst,
                   least($2, greatest(0, now_us + rate_burst * e - base) / e) AS allowed
            FROM (SELECT now_us, rate_burst,
                         greatest(1, (rate_per_us + rate_count - rate_burst)
                                     / (rate_count - rate_burst + 1)) AS e,
                         greatest(coalesce(rate_tat, now_us), now_us) AS base
                  FROM settings
                  WHERE NOT paused AND max_running IS NULL AND NOT keyed
                    AND rate_count IS NOT NULL) x),"
    };
}

/// The rated claim's size: what the rate allows (0 when the queue is no longer
/// rate-only, so that nothing is claimed and the flags send the caller elsewhere).
macro_rules! allowed {
    () => {
        "(SELECT coalesce(max(allowed), 0) FROM rated)"
    };
}

/// The rated claim's new next start, and the wait it names when the rate cut it short
/// (SPEC K10), as `kit::rate::RateAdmission::next_in` computes them.
macro_rules! rated_tail {
    () => {
        "
            taken AS MATERIALIZED (SELECT count(*) AS n FROM claimed),
            tat AS (
                UPDATE {s}.queues SET rate_tat = r.base + t.n * r.e
                FROM rated r, taken t WHERE queue = $1 AND t.n > 0),"
    };
}

macro_rules! rated_wait {
    () => {
        "(SELECT CASE WHEN r.allowed < $2 AND t.n >= r.allowed
                     THEN greatest(0, r.base + t.n * r.e - (r.burst - 1) * r.e - r.now_us) END
          FROM rated r, taken t)"
    };
}

/// Claims for a queue with no limit and not paused: one statement, no lock but the
/// claimed rows'; expired leases are taken over too.
const CLAIM_FREE: &str = claim_sql!(
    settings!(),
    up_to_limit!(),
    free!(),
    "",
    "$2",
    "",
    "NULL::bigint"
);
/// [`CLAIM_FREE`] without looking for expired leases: see [`ExpiryClock`]. The
/// constant-false condition leaves both scans of the running index out of the plan.
const CLAIM_FREE_READY: &str = claim_sql!(
    settings!(),
    up_to_limit!(),
    free!(),
    "AND false ",
    "$2",
    "",
    "NULL::bigint"
);
/// Claims under the queue row's lock, with the limit already cut to the free room;
/// expired leases were handled just before (see `claim_limited`).
const CLAIM_LIMITED_READY: &str = claim_sql!(
    settings!(),
    up_to_limit!(),
    "",
    "AND false ",
    "$2",
    "",
    "NULL::bigint"
);
/// Claims for a queue whose only limit is a rate (SPEC K9): one statement, which holds
/// the queue row's lock from its read of the rate to its commit. The last column is the
/// wait the rate names when it cut the claim short, in microseconds.
const CLAIM_RATED: &str = claim_sql!(
    rated_head!(),
    "SELECT allowed AS lim FROM rated WHERE allowed > 0 ",
    "",
    "",
    allowed!(),
    rated_tail!(),
    rated_wait!()
);
/// [`CLAIM_RATED`] without looking for expired leases.
const CLAIM_RATED_READY: &str = claim_sql!(
    rated_head!(),
    "SELECT allowed AS lim FROM rated WHERE allowed > 0 ",
    "",
    "AND false ",
    allowed!(),
    rated_tail!(),
    rated_wait!()
);

/// How often a handle's claims of one queue look for expired leases (SPEC C5).
///
/// Finding them reads the running index's range of leases past their expiry, and
/// under churn that range fills with the entries of finished jobs that vacuum has not
/// removed yet (all of them while another session holds a transaction open): at 2,000
/// jobs/s a claim's two scans there went from 2 to 89 buffers within a minute of an
/// autovacuum pass, on every claim, hundreds a second. Looking at most every
/// `EXPIRY_EVERY` per queue and handle bounds that cost, whatever the claim rate, and
/// delays the takeover of an expired lease by at most as long (leases run for
/// seconds; `maintain` expires them too).
pub(crate) const EXPIRY_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The queues whose claims last found a rate as their only limit: their claims start
/// with [`CLAIM_RATED`] and skip a statement. A hint only: both statements read the
/// queue's settings themselves.
#[derive(Debug, Default)]
pub(crate) struct RatedQueues(std::sync::Mutex<std::collections::HashSet<String>>);

impl RatedQueues {
    fn has(&self, queue: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(queue)
    }

    fn set(&self, queue: &str, rated: bool) {
        let mut set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if rated {
            set.insert(queue.to_owned());
        } else {
            set.remove(queue);
        }
    }
}

/// When each queue's claims last looked for expired leases.
#[derive(Debug, Default)]
pub(crate) struct ExpiryClock(
    std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
);

impl ExpiryClock {
    /// Whether a claim of `queue` should look now; if so, the look counts as made.
    fn due(&self, queue: &str) -> bool {
        let now = std::time::Instant::now();
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.get_mut(queue) {
            Some(at) if now.duration_since(*at) < EXPIRY_EVERY => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                last.insert(queue.to_owned(), now);
                true
            }
        }
    }
}

/// A job whose lease expired: (made dead, group, batch, stage).
type Expired = (bool, Option<String>, Option<i64>, Option<i32>, i64);

/// One row of the claim statement: the flags, and a claimed job unless none was.
pub(crate) struct Row {
    /// 0: the queue has no limit; 1: it has a limit other than a rate alone, claimed
    /// under its row's lock; 2: a rate alone ([`CLAIM_RATED`]).
    limited: i32,
    doomed: bool,
    id: Option<i64>,
    lease_token: Option<uuid::Uuid>,
    attempts: Option<i16>,
    payload: Option<Vec<u8>>,
    priority: Option<i16>,
    run_at: Option<DateTime<Utc>>,
    max_attempts: Option<i16>,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i32>,
    enqueued_by: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    /// The wait a rate named, in microseconds ([`CLAIM_RATED`]).
    wait_us: Option<i64>,
}

/// By position, in the order of the statement's final `SELECT`, and without sqlx's check
/// of each column's type against the Rust type: the column names' look-up and those
/// checks were more than half of the instructions a draining worker spent decoding
/// rows. The statement fixes the columns and their types. Nothing checks the order at run
/// time: each swap of two columns tried failed the conformance suite (14 to 61 of its
/// cases), whose case c1 checks every field of a claimed job.
impl sqlx::FromRow<'_, PgRow> for Row {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            limited: row.try_get_unchecked(0)?,
            doomed: row.try_get_unchecked(1)?,
            id: row.try_get_unchecked(2)?,
            lease_token: row.try_get_unchecked(3)?,
            attempts: row.try_get_unchecked(4)?,
            payload: row.try_get_unchecked(5)?,
            priority: row.try_get_unchecked(6)?,
            run_at: row.try_get_unchecked(7)?,
            max_attempts: row.try_get_unchecked(8)?,
            group_key: row.try_get_unchecked(9)?,
            batch_id: row.try_get_unchecked(10)?,
            stage: row.try_get_unchecked(11)?,
            enqueued_by: row.try_get_unchecked(12)?,
            lease_expires_at: row.try_get_unchecked(13)?,
            wait_us: row.try_get_unchecked(14)?,
        })
    }
}

/// What a claim statement found besides its jobs.
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) jobs: Vec<ClaimedJob>,
    limited: i32,
    doomed: bool,
    /// Set when the queue's rate cut the claim short (SPEC K10).
    next_in: Option<std::time::Duration>,
    /// Set when a key's rate held a job back and the claim came back short (SPEC K13).
    pub(crate) wake_in: Option<std::time::Duration>,
}

fn missing() -> Error {
    Error::backend("claimed row lacks a column")
}

pub(crate) fn to_found(req: &ClaimRequest, rows: Vec<Row>) -> Result<Found> {
    let mut found = Found::default();
    for r in rows {
        found.limited = found.limited.max(r.limited);
        found.doomed |= r.doomed;
        if let Some(us) = r.wait_us {
            found.next_in = Some(std::time::Duration::from_micros(us.unsigned_abs()));
        }
        let Some(id) = r.id else { continue };
        found.jobs.push(ClaimedJob {
            lease: Lease {
                queue: req.queue.clone(),
                job: JobId(id),
                token: LeaseToken(r.lease_token.ok_or_else(missing)?),
                attempt: u32::try_from(r.attempts.ok_or_else(missing)?).map_err(Error::backend)?,
                expires_at: r.lease_expires_at.ok_or_else(missing)?,
                worker: req.worker.clone(),
            },
            payload: r.payload.ok_or_else(missing)?,
            priority: r.priority.ok_or_else(missing)?,
            run_at: r.run_at.ok_or_else(missing)?,
            max_attempts: u16::try_from(r.max_attempts.ok_or_else(missing)?)
                .map_err(Error::backend)?,
            group: r.group_key,
            batch: r.batch_id.map(BatchId),
            stage: r.stage,
            enqueued_by: r.enqueued_by,
        });
    }
    Ok(found)
}

/// A limited queue's settings, its row locked: pause, `max_running`, keys, the rate
/// (count, interval, burst, next start; the row's newest version, fetched again after
/// the wait when a claim before it moved the rate on) and the transaction's start,
/// which a claim without keys starts its jobs at (SPEC K9).
const LOCK_QUEUE: &str = "SELECT paused, max_running, keyed, rate_count, rate_per_us, rate_burst,
        rate_tat, now(), key_rated, key_rate_count, key_rate_per_us, key_rate_burst
    FROM {s}.queues WHERE queue = $1 FOR UPDATE";

type Settings = (
    bool,
    Option<i32>,
    bool,
    Option<i32>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    DateTime<Utc>,
    bool,
    Option<i32>,
    Option<i64>,
    Option<i32>,
);

/// One fresh random token for each job a claim of `limit` may take.
pub(crate) fn tokens(limit: i64) -> Vec<uuid::Uuid> {
    (0..limit).map(|_| LeaseToken::random().0).collect()
}

impl PostgresBackend {
    async fn claim_statement<'c, E>(
        &self,
        c: E,
        sql: &'static str,
        req: &ClaimRequest,
        limit: i64,
    ) -> Result<Found>
    where
        E: sqlx::PgExecutor<'c>,
    {
        // `limit` is at most the request's, which was validated to 1..=1000.
        let literal = u32::try_from(limit)
            .map_err(Error::backend)?
            .next_power_of_two();
        let rows: Vec<Row> = sqlx::query_as(self.sql_limit(sql, literal))
            .bind(&req.queue)
            .bind(limit)
            .bind(micros(req.lease))
            .bind(&req.worker)
            .bind(!self.inner.durable_claims)
            .bind(tokens(limit))
            .fetch_all(c)
            .await
            .map_err(db)?;
        to_found(req, rows)
    }

    /// SPEC C6: claims of a limited queue hold the queue row's lock, and count the
    /// running jobs in a statement that starts after they got it, so concurrent
    /// claimers see each other's jobs and together never exceed `max_running`.
    ///
    /// So a limited queue's claimers take turns, each holding the row for one short
    /// transaction: the one place where claimers wait for each other (SPEC C4), the
    /// price of an exact limit. Unlimited queues never do. A claim that was already
    /// running when `set_max_running` committed may still claim under the old setting.
    async fn claim_limited(&self, req: &ClaimRequest, limit: i64, expire: bool) -> Result<Found> {
        if expire {
            // Expired leases first, in a transaction of their own: a keyed claim counts
            // an expired job's slot as held until then (SPEC K2), and the dead-bound
            // ones are made dead here too.
            self.expire(&req.queue, true).await?;
        }
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let settings: Option<Settings> = sqlx::query_as(self.sql(LOCK_QUEUE))
            .bind(&req.queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let mut limit = limit;
        let keyed = settings.as_ref().is_some_and(|s| s.2);
        let rate = settings
            .as_ref()
            .and_then(|s| crate::inspect::stored_rate(s.3, s.4, s.5));
        // The time the rate judges the claim at, which its jobs then start at: for a
        // keyed claim the clock read after the lock (its statements time their jobs
        // so; the lock statement's own reading may predate its wait), else the
        // transaction's start, which the one claim statement uses.
        let tat = settings.as_ref().and_then(|s| s.6);
        // SPEC K12: the default key rate, when the queue's keys have rates.
        let key_rates = settings.as_ref().filter(|s| s.8).map(|s| KeyRates {
            default: crate::inspect::stored_rate(s.9, s.10, s.11),
        });
        let at = match &settings {
            Some(s) if s.2 && (rate.is_some() || s.8) => Some(
                sqlx::query_scalar("SELECT clock_timestamp()")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?,
            ),
            Some(s) => Some(s.7),
            None => None,
        };
        match settings {
            Some((true, ..)) => limit = 0,
            Some((false, Some(max), ..)) => {
                // A job whose lease expired holds no slot: the claim below may take it
                // over (SPEC C5), which counts it again.
                let running: i64 = sqlx::query_scalar(self.sql(
                    "SELECT count(*) FROM {s}.jobs
                     WHERE queue = $1 AND state = 'running' AND lease_expires_at > now()",
                ))
                .bind(&req.queue)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
                limit = limit.min(i64::from(max) - running);
            }
            _ => {}
        }
        // SPEC K9: the rate is read and moved on under the queue row's lock, at `at`,
        // the time the claimed jobs start at. Rates hold for any order of those times
        // among claims (`kit::rate`): each claim's time need only be its jobs' start.
        let paced = match (rate, at) {
            (Some(rate), Some(at)) if limit > 0 => Some(relayq_core::kit::rate::admit(
                &rate,
                tat,
                at.timestamp_micros(),
                u32::try_from(limit).map_err(Error::backend)?,
            )),
            _ => None,
        };
        if let Some(p) = &paced {
            limit = i64::from(p.allowed);
        }
        let mut found = if limit <= 0 {
            Found::default()
        } else if keyed {
            let timed = paced.is_some() || key_rates.is_some();
            self.claim_keyed(&mut tx, req, limit, at.filter(|_| timed), key_rates)
                .await?
        } else {
            self.claim_statement(&mut *tx, CLAIM_LIMITED_READY, req, limit)
                .await?
        };
        if let Some(p) = paced {
            let taken = u32::try_from(found.jobs.len()).map_err(Error::backend)?;
            if let Some(tat) = p.tat(taken) {
                sqlx::query(self.sql("UPDATE {s}.queues SET rate_tat = $2 WHERE queue = $1"))
                    .bind(&req.queue)
                    .bind(tat)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            found.next_in = p.next_in(taken);
        }
        tx.commit().await.map_err(db)?;
        Ok(found)
    }

    async fn claim_up_to(&self, req: &ClaimRequest, limit: i64) -> Result<Found> {
        let expire = self.inner.expiry.due(&req.queue);
        let sql = if expire { CLAIM_FREE } else { CLAIM_FREE_READY };
        let rated_sql = if expire {
            CLAIM_RATED
        } else {
            CLAIM_RATED_READY
        };
        // A queue last seen with a rate alone goes to its statement first; either
        // statement reads the settings itself and says where to go when they changed.
        let mut found = if self.inner.rated.has(&req.queue) {
            self.claim_statement(self.pool(), rated_sql, req, limit)
                .await?
        } else {
            self.claim_statement(self.pool(), sql, req, limit).await?
        };
        if found.limited == 2 && !self.inner.rated.has(&req.queue) {
            self.inner.rated.set(&req.queue, true);
            let doomed = found.doomed;
            found = self
                .claim_statement(self.pool(), rated_sql, req, limit)
                .await?;
            found.doomed |= doomed;
        }
        if found.limited == 2 {
            return Ok(found);
        }
        if self.inner.rated.has(&req.queue) {
            // Its settings changed: from now on the plain statement goes first again.
            self.inner.rated.set(&req.queue, false);
            if found.limited == 0 {
                found = self.claim_statement(self.pool(), sql, req, limit).await?;
            }
        }
        if found.limited > 0 {
            let doomed = found.doomed;
            let mut limited = self.claim_limited(req, limit, expire).await?;
            limited.doomed |= doomed;
            return Ok(limited);
        }
        Ok(found)
    }

    /// SPEC C5: running jobs of `queue` whose lease expired are closed in the log and
    /// retry in place (keeping group and stage), or, without attempts left, are dead,
    /// which releases what waited for them. With `all` false, only the dead-bound ones
    /// (the claim statement takes the others over itself). Returns (requeued, dead).
    pub(crate) async fn expire(&self, queue: &str, all: bool) -> Result<(u64, u64)> {
        let (counts, payloads) =
            retry_transient(|| self.expire_tx(queue, all), crate::retryable).await?;
        self.notify_local(&payloads);
        Ok(counts)
    }

    async fn expire_tx(&self, queue: &str, all: bool) -> Result<((u64, u64), Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        // (dead rather than requeued, group, batch, stage)
        let rows: Vec<Expired> = sqlx::query_as(self.sql(concat!(
            "WITH e AS MATERIALIZED (
                    SELECT id, attempts, max_attempts, worker, started_at FROM {s}.jobs
                    WHERE queue = $1 AND state = 'running' AND lease_expires_at <= now()
                      AND ($2 OR attempts >= max_attempts)
                    ORDER BY id FOR UPDATE SKIP LOCKED),
                logged AS (
                    INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at,
                                              outcome, error, claimed_at)
                    SELECT id, attempts, worker, started_at, now(), 'expired', 'lease expired',
                           started_at
                    FROM e),
                requeued AS (
                    UPDATE {s}.jobs j
                    SET state = 'retrying', last_error = 'lease expired', lease_token = NULL,
                        lease_expires_at = NULL
                    WHERE j.id = ANY (ARRAY(SELECT id FROM e WHERE attempts < max_attempts))
                      AND EXISTS (SELECT 1 FROM e WHERE attempts < max_attempts)
                    RETURNING j.id),
                g AS (
                    DELETE FROM {s}.jobs j
                    WHERE j.id = ANY (ARRAY(SELECT id FROM e WHERE attempts >= max_attempts))
                      AND EXISTS (SELECT 1 FROM e WHERE attempts >= max_attempts)
                    RETURNING j.*),
                archived AS (",
            archive!("g", "'dead'", "'lease expired'"),
            ")
                SELECT true, group_key, batch_id, stage, id FROM g
                UNION ALL
                SELECT false, NULL, NULL, NULL, id FROM requeued"
        )))
        .bind(queue)
        .bind(all)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let mut touched = Touched::default();
        let (mut requeued, mut dead) = (0, 0);
        for (is_dead, group, batch, stage, id) in rows {
            if is_dead {
                dead += 1;
                touched.left(queue, group.as_deref(), batch, stage, JobState::Dead);
                touched.parent(id, batch, JobState::Dead);
            } else {
                requeued += 1;
            }
        }
        if requeued > 0 {
            touched.ready.insert(queue.to_owned());
        }
        promote::promote(&mut tx, &self.inner.schema, &mut touched).await?;
        let payloads = touched.payloads();
        crate::listen::send(&mut tx, &self.inner.schema.channel(), &touched.unsent()).await?;
        tx.commit().await.map_err(db)?;
        Ok(((requeued, dead), payloads))
    }
}

impl PostgresBackend {
    /// The plan PostgreSQL picks for the claim statement of `queue` with `limit`: the
    /// custom plan for these values, or, with `generic`, the generic plan a prepared
    /// statement may switch to after five executions. For checking that the hot path
    /// has no sequential scan on your data (see the plan in this module's docs). The
    /// queue's head is read inside `claim_ready`, which shows as a function scan: its
    /// settings allow only the ordered scan of `jobs_claim`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad queue name or limit; [`Error::Backend`] when
    /// the server fails.
    pub async fn explain_claim(&self, queue: &str, limit: u32, generic: bool) -> Result<String> {
        validate::claim(&ClaimRequest::new(
            queue,
            "explain",
            limit,
            std::time::Duration::from_secs(30),
        ))?;
        let sql = self.sql_limit(CLAIM_FREE, limit).0;
        // The queue name was validated: letters, digits and `_-.:` only.
        let args = format!("'{queue}', {limit}, 30e6, 'explain', false, '{{}}'");
        self.explain(
            &sql,
            "text, bigint, float8, text, boolean, uuid[]",
            &args,
            generic,
        )
        .await
    }
}

#[async_trait]
impl Claim for PostgresBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<relayq_core::Claimed> {
        // RETURNING has no order: the kit sorts by order key (SPEC C3).
        let req = &req;
        let waits = std::sync::Mutex::new((None, None));
        let paced = &waits;
        let jobs = relayq_core::kit::claim_refilling(
            req.limit,
            |room| async move {
                let found = self.claim_up_to(req, i64::from(room)).await?;
                let mut waits = paced
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                waits.0 = found.next_in.or(waits.0);
                waits.1 = found.wake_in.or(waits.1);
                drop(waits);
                Ok((found.jobs, found.doomed))
            },
            || async { self.expire(&req.queue, false).await.map(drop) },
        )
        .await?;
        let (next_in, wake_in) = waits
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(relayq_core::Claimed::new(jobs, next_in).waking_in(wake_in))
    }
}

#[cfg(test)]
mod tests {
    use relayq_conformance::harness::{Server, server_url};
    use relayq_core::{EnqueueExt, NewJob};

    use super::*;
    use crate::Config;

    /// A handle's claims of a queue look for expired leases at most once per
    /// `EXPIRY_EVERY`; other queues keep their own clock.
    #[test]
    fn expired_leases_are_looked_for_once_per_interval() {
        let clock = ExpiryClock::default();
        assert!(clock.due("a"), "the first claim looks");
        assert!(!clock.due("a"), "the next one, right after, does not");
        assert!(clock.due("b"), "another queue has a clock of its own");
    }

    /// Claims between two looks for expired leases read nothing of the running index:
    /// their plan has no scan of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        relayq_no_postgres,
        ignore = "no postgres server: RELAYQ_POSTGRES_URL unset"
    )]
    async fn claims_between_expiry_looks_leave_the_running_index_alone() {
        let url = server_url(Server::of(&crate::DRIVER))
            .await
            .expect("RELAYQ_POSTGRES_URL");
        let schema = crate::test_schema::fresh("ready");
        let b = PostgresBackend::connect_with(&url, Config::default().with_schema(schema.clone()))
            .await
            .unwrap();
        b.migrate().await.unwrap();
        let args = "'q', 8, 30e6, 'explain', false, '{}'";
        let types = "text, bigint, float8, text, boolean, uuid[]";
        for generic in [false, true] {
            let sql = b.sql_limit(CLAIM_FREE_READY, 8).0;
            let plan = b.explain(&sql, types, args, generic).await.unwrap();
            assert!(!plan.contains("jobs_running"), "generic={generic}:\n{plan}");
            let sql = b.sql_limit(CLAIM_FREE, 8).0;
            let plan = b.explain(&sql, types, args, generic).await.unwrap();
            assert!(plan.contains("jobs_running"), "generic={generic}:\n{plan}");
        }
        crate::test_schema::drop(b.pool(), &schema).await;
    }

    /// The claim statement turns `synchronous_commit` off for the transaction it runs
    /// in, unless claims are durable (see `Config::durable_claims`). Run inside an open
    /// transaction here, so the setting can be read before the commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        relayq_no_postgres,
        ignore = "no postgres server: RELAYQ_POSTGRES_URL unset"
    )]
    async fn claims_commit_asynchronously_unless_durable() {
        let url = server_url(Server::of(&crate::DRIVER))
            .await
            .expect("RELAYQ_POSTGRES_URL");
        let schema = crate::test_schema::fresh("async");
        for (durable, want) in [(false, "off"), (true, "on")] {
            let config = Config::default()
                .with_schema(schema.clone())
                .with_durable_claims(durable);
            let b = PostgresBackend::connect_with(&url, config).await.unwrap();
            b.migrate().await.unwrap();
            let q = relayq_conformance::queue_name("async");
            b.enqueue_one(NewJob::new(&q, vec![])).await.unwrap();
            let mut tx = b.pool().begin().await.unwrap();
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(&mut *tx)
                .await
                .unwrap();
            let req = ClaimRequest::new(&q, "w", 1, std::time::Duration::from_secs(30));
            let found = b
                .claim_statement(&mut *tx, CLAIM_FREE, &req, 1)
                .await
                .unwrap();
            assert_eq!(found.jobs.len(), 1);
            let now: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(now, want, "durable claims: {durable}");
            tx.rollback().await.unwrap();
        }
        let b = PostgresBackend::connect(&url).await.unwrap();
        crate::test_schema::drop(b.pool(), &schema).await;
    }
}
