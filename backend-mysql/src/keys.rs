//! SPEC K1–K7: limit keys. A keyed queue's claims take its row exclusively, so each
//! key's running count is read and raised in one step, and decide each candidate in
//! order with `kit::keys::KeyAdmission`: taken, left, or parked out of the claim index
//! (`claim_queue` is `NULL` for a parked job) when its key is full, so that claims stop
//! reading a full key's waiting jobs.
//!
//! A parked job goes back when a slot of its key frees: whatever takes a keyed job out
//! of `running` (a settle, an expiry, a cancel, a halt), or takes an unparked waiting
//! one out of `ready`/`retrying` other than a claim (a cancel, a demotion to `blocked`),
//! puts back the earliest parked job of its key in the same transaction
//! ([`freed`]). MySQL's triggers cannot change the table that fired them, so each of
//! those places calls it.

use std::collections::{BTreeSet, HashMap};

use relayq_core::{
    ClaimRequest, KeyLimits, KeyUse, Result,
    kit::keys::{KeyAdmission, KeyInfo},
};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, MysqlBackend, claim::Candidate, db, key_rates, lock::QueueRow};

/// Each read of a keyed claim looks this far past the room it has.
const FIRST_EXTRA: i64 = 16;
/// A read after one that parked looks this far past.
const SCAN_EXTRA: i64 = 256;
/// Reads per claim at most.
const SCAN_ROUNDS: usize = 8;

/// A keyed claim's candidates: the head of the claim index, with each job's key, read
/// plainly: the claim holds the queue's lock exclusively, so no other claim or write
/// changes them, and a locking read would also lock the entry past the queue's last
/// (another queue's job: `by_id.rs`).
const CANDIDATES: &str = "SELECT id, attempts, payload, priority, run_at, max_attempts,
        CAST(group_key AS CHAR), batch_id, stage, CAST(enqueued_by AS CHAR),
        CAST(limit_key AS CHAR)
    FROM relayq_jobs FORCE INDEX (relayq_jobs_claim)
    WHERE claim_queue = ? AND run_at <= ?
    ORDER BY priority, run_at, id LIMIT ?";

/// The earliest parked jobs of a key, up to `?` (put back by id: `by_id.rs`).
pub(crate) const PARKED_FIRST: &str = "SELECT id FROM relayq_jobs
    WHERE queue = ? AND parked_key = ? ORDER BY priority, run_at, id LIMIT ?";

/// Puts back the parked jobs `ids`.
pub(crate) async fn unpark(c: &mut Conn, ids: &[i64]) -> Result<()> {
    crate::by_id::update(c, ids, |q| {
        q.push("UPDATE relayq_jobs SET parked = FALSE");
    })
    .await?;
    Ok(())
}

/// The queue's parked jobs, of key `key` only when given, go back to the claim index
/// after a change of its key limits or rates: the next claim parks again those still
/// held (SPEC K3, K12).
pub(crate) async fn unpark_all(c: &mut Conn, queue: &str, key: Option<&str>) -> Result<()> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM relayq_jobs
         WHERE queue = ? AND parked_key IS NOT NULL AND (? IS NULL OR parked_key = ?)",
    )
    .bind(queue)
    .bind(key)
    .bind(key)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    unpark(c, &ids).await
}

/// Sets the queue's `keyed` and `key_rated` from what it keeps, after a change of its
/// key limits or rates (the claim reads them in the queue's row).
pub(crate) async fn refresh_keyed(c: &mut Conn, queue: &str) -> Result<()> {
    let (limited, rated): (bool, bool) = sqlx::query_as(
        "SELECT key_limit IS NOT NULL
                OR EXISTS (SELECT 1 FROM relayq_key_limits WHERE queue = ?),
            key_rate_count IS NOT NULL
                OR EXISTS (SELECT 1 FROM relayq_key_rates WHERE queue = ?)
         FROM relayq_queues WHERE queue = ?",
    )
    .bind(queue)
    .bind(queue)
    .bind(queue)
    .fetch_one(&mut *c)
    .await
    .map_err(db)?;
    sqlx::query("UPDATE relayq_queues SET keyed = ?, key_rated = ? WHERE queue = ?")
        .bind(limited || rated)
        .bind(rated)
        .bind(queue)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

/// How many due waiting jobs of its key ahead of a new job park it at enqueue, for a
/// key whose limit is at most that.
const PARK_AHEAD: i64 = 64;

/// SPEC K4: after an enqueue into a keyed queue, parks each new job that has
/// [`PARK_AHEAD`] due, waiting, unparked jobs of its key ahead of it in claim order,
/// for a key whose limit is at most that. Those jobs each put one parked job of the
/// key back when they leave (a claim and its end, a cancel, a demotion: [`freed`]), so
/// a job parked here always has something to put it back, and claims never read a
/// long backlog of one key. Jobs not yet due are not counted: one of them ahead would
/// hold a due job back. Per key of the call, one read of its first [`PARK_AHEAD`]
/// waiting jobs in claim order: a new due job not among them has that many ahead.
pub(crate) async fn park_new(
    c: &mut Conn,
    queue: &str,
    jobs: &[relayq_core::NewJob],
    out: &[relayq_core::Enqueued],
    now: i64,
) -> Result<()> {
    let new: std::collections::HashSet<i64> = relayq_core::kit::keys::new_keyed_ids(jobs, out)
        .into_iter()
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let default: Option<Option<i64>> =
        sqlx::query_scalar("SELECT key_limit FROM relayq_queues WHERE queue = ? AND keyed")
            .bind(queue)
            .fetch_optional(&mut *c)
            .await
            .map_err(db)?;
    let Some(default) = default else {
        return Ok(());
    };
    let mut by_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for (job, e) in jobs.iter().zip(out) {
        if let Some(k) = job.limit_key.as_deref()
            && new.contains(&e.id.0)
            && job.run_at.resolve(crate::at(now)) <= crate::at(now)
        {
            by_key.entry(k).or_default().push(e.id.0);
        }
    }
    let keys: Vec<&str> = by_key.keys().copied().collect();
    if keys.is_empty() {
        return Ok(());
    }
    let limits = key_info(c, queue, &keys, default).await?;
    let mut park = Vec::new();
    for (key, ids) in by_key {
        let small = limits
            .get(key)
            .and_then(|i| i.limit)
            .is_some_and(|l| i64::from(l) <= PARK_AHEAD);
        if !small {
            continue;
        }
        let first: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM relayq_jobs
             WHERE queue = ? AND waiting_key = ? AND run_at <= ?
             ORDER BY priority, run_at, id LIMIT ?",
        )
        .bind(queue)
        .bind(key)
        .bind(now)
        .bind(PARK_AHEAD)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
        if i64::try_from(first.len()).unwrap_or(0) < PARK_AHEAD {
            continue;
        }
        park.extend(ids.into_iter().filter(|id| !first.contains(id)));
    }
    for chunk in park.chunks(10_000) {
        // Only waiting jobs: one stored blocked (its group's, its stage's or its
        // parents' turn to come) is not in the claim index to leave.
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE relayq_jobs SET parked = TRUE WHERE state = 'ready' AND id IN (",
        );
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        list.push_unseparated(")");
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    Ok(())
}

/// A keyed job left `running`, or left waiting unparked other than by a claim: the
/// earliest parked job of its key goes back to the claim index. Nothing for no key.
pub(crate) async fn freed(c: &mut Conn, queue: &str, key: Option<&str>) -> Result<()> {
    let Some(key) = key else { return Ok(()) };
    let first: Vec<i64> = sqlx::query_scalar(PARKED_FIRST)
        .bind(queue)
        .bind(key)
        .bind(1_i64)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    unpark(c, &first).await
}

/// Each key's limit (its own, else `default`) and running jobs, jobs held ahead in a
/// buffer included (SPEC K2).
async fn key_info(
    c: &mut Conn,
    queue: &str,
    keys: &[&str],
    default: Option<i64>,
) -> Result<HashMap<String, KeyInfo>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT CAST(limit_key AS CHAR), max FROM relayq_key_limits WHERE queue = ",
    );
    q.push_bind(queue).push(" AND limit_key IN ");
    push_list(&mut q, keys);
    let own: Vec<(String, i64)> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT CAST(limit_key AS CHAR), COUNT(*) FROM relayq_jobs WHERE running_queue = ",
    );
    q.push_bind(queue).push(" AND limit_key IN ");
    push_list(&mut q, keys);
    q.push(" GROUP BY limit_key");
    let running: Vec<(String, i64)> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
    let running: HashMap<String, i64> = running.into_iter().collect();
    let own: HashMap<String, i64> = own.into_iter().collect();
    Ok(keys
        .iter()
        .map(|k| {
            let limit = own.get(*k).copied().or(default);
            let limit = limit.and_then(|m| u32::try_from(m).ok());
            let n = running.get(*k).copied().unwrap_or(0).unsigned_abs();
            ((*k).to_owned(), KeyInfo::limited(limit, n))
        })
        .collect())
}

fn push_list(q: &mut QueryBuilder<MySql>, items: &[&str]) {
    q.push("(");
    let mut list = q.separated(", ");
    for k in items {
        list.push_bind(*k);
    }
    list.push_unseparated(")");
}

/// A keyed claim inside the transaction holding the queue's exclusive lock: reads the
/// queue's head in rounds, takes what each key has room for, parks the jobs of full
/// keys, and reads again past them while it has room.
pub(crate) async fn claim_keyed(
    c: &mut Conn,
    req: &ClaimRequest,
    limit: i64,
    now: i64,
    queue: &QueueRow,
) -> Result<(Vec<Candidate>, Option<std::time::Duration>)> {
    let (default, rated, default_rate) = (queue.key_limit, queue.key_rated, queue.key_rate);
    let woken = if rated {
        key_rates::wake(c, &req.queue, now, default_rate).await?
    } else {
        Vec::new()
    };
    let want = u32::try_from(limit).unwrap_or(u32::MAX);
    let mut admission = KeyAdmission::new(want, req.slots).at(now);
    let mut keys: HashMap<String, KeyInfo> = HashMap::new();
    let mut rows = Vec::new();
    let mut scan = 2 * limit + FIRST_EXTRA;
    for _ in 0..SCAN_ROUNDS {
        let read: Vec<(Candidate, Option<String>)> = sqlx::query_as::<_, Keyed>(CANDIDATES)
            .bind(&req.queue)
            .bind(now)
            .bind(scan)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?
            .into_iter()
            .map(|k| (k.job, k.key))
            .collect();
        let new: BTreeSet<&str> = read
            .iter()
            .filter_map(|(_, k)| k.as_deref())
            .filter(|k| !keys.contains_key(*k))
            .collect();
        if !new.is_empty() {
            let new: Vec<&str> = new.into_iter().collect();
            let mut found = key_info(c, &req.queue, &new, default).await?;
            if rated {
                // Each new key is under the default until its row says otherwise.
                for info in found.values_mut() {
                    info.rate = default_rate;
                }
                for k in key_rates::stored(c, &req.queue, &new).await? {
                    if let Some(info) = found.get_mut(&k.key) {
                        info.rate = k.rate(default_rate);
                        info.tat = k.tat;
                    }
                }
            }
            keys.extend(found);
        }
        let candidates: Vec<(i64, Option<String>)> =
            read.iter().map(|(j, k)| (j.id, k.clone())).collect();
        let (taken, parked) = admission.split(&candidates, &keys);
        if !parked.is_empty() {
            let mut q =
                QueryBuilder::<MySql>::new("UPDATE relayq_jobs SET parked = TRUE WHERE id IN ");
            q.push("(");
            let mut list = q.separated(", ");
            for id in &parked {
                list.push_bind(*id);
            }
            list.push_unseparated(")");
            q.build().execute(&mut *c).await.map_err(db)?;
        }
        let n = read.len();
        let mut chosen: Vec<Candidate> = read
            .into_iter()
            .map(|(j, _)| j)
            .filter(|j| taken.contains(&j.id))
            .collect();
        // Started now, so that the next read does not return them again.
        if !chosen.is_empty() {
            crate::claim::start(c, &mut chosen, req, now).await?;
            rows.extend(chosen);
        }
        if admission.done() || i64::try_from(n).unwrap_or(0) < scan || parked.is_empty() {
            break;
        }
        scan = 2 * limit + SCAN_EXTRA;
    }
    if !rated {
        return Ok((rows, None));
    }
    let short = rows.len() < usize::try_from(limit).unwrap_or(usize::MAX);
    let wake_in =
        key_rates::after_claim(c, &req.queue, &admission, woken, default_rate, short, now).await?;
    Ok((rows, wake_in))
}

/// A row of [`CANDIDATES`]: the claim's columns and the job's key.
struct Keyed {
    job: Candidate,
    key: Option<String>,
}

impl sqlx::FromRow<'_, sqlx::mysql::MySqlRow> for Keyed {
    fn from_row(row: &sqlx::mysql::MySqlRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(Self {
            job: Candidate::from_row(row)?,
            key: row.try_get(10)?,
        })
    }
}

impl MysqlBackend {
    /// SPEC K3: stores a key's limit (`key` `None`: the default of every key without
    /// one), under the queue's lock; every parked job of the queue goes back to the
    /// claim index, and the next claim parks again those whose key is still full.
    pub(crate) async fn set_key_limit_once(
        &self,
        queue: &str,
        key: Option<&str>,
        limit: Option<u32>,
    ) -> Result<()> {
        let (mut tx, _) = self.write(&[queue]).await?;
        let limit = limit.map(i64::from);
        match key {
            None => sqlx::query("UPDATE relayq_queues SET key_limit = ? WHERE queue = ?")
                .bind(limit)
                .bind(queue),
            Some(key) if limit.is_some() => sqlx::query(
                "INSERT INTO relayq_key_limits (queue, limit_key, max) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE max = VALUES(max)",
            )
            .bind(queue)
            .bind(key)
            .bind(limit),
            Some(key) => {
                sqlx::query("DELETE FROM relayq_key_limits WHERE queue = ? AND limit_key = ?")
                    .bind(queue)
                    .bind(key)
            }
        }
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        unpark_all(&mut tx, queue, None).await?;
        refresh_keyed(&mut tx, queue).await?;
        tx.commit().await.map_err(db)
    }

    /// SPEC K7, K14: the queue's defaults, and each key with running jobs, a limit or
    /// rate of its own, or a next start ahead under the default rate (at most
    /// `KEYS_LISTED`, by name).
    pub(crate) async fn key_limits_of(&self, queue: &str) -> Result<KeyLimits> {
        type Defaults = (Option<i64>, Option<i64>, Option<i64>, Option<i64>, i64);
        let (default, count, per, burst, now): Defaults = sqlx::query_as(
            "SELECT key_limit, key_rate_count, key_rate_per_us, key_rate_burst,
                 CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)
             FROM relayq_queues WHERE queue = ?",
        )
        .bind(queue)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(db)?
        .unwrap_or_default();
        let listed = i64::try_from(relayq_core::KEYS_LISTED).unwrap_or(i64::MAX);
        let running: Vec<(String, i64)> = sqlx::query_as(
            "SELECT CAST(limit_key AS CHAR), COUNT(*) FROM relayq_jobs
             WHERE running_queue = ? AND limit_key IS NOT NULL
             GROUP BY limit_key ORDER BY limit_key LIMIT ?",
        )
        .bind(queue)
        .bind(listed)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(db)?;
        let own: Vec<(String, i64)> = sqlx::query_as(
            "SELECT CAST(limit_key AS CHAR), max FROM relayq_key_limits
             WHERE queue = ? ORDER BY limit_key LIMIT ?",
        )
        .bind(queue)
        .bind(listed)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(db)?;
        type RateRow = (String, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let rates: Vec<RateRow> = sqlx::query_as(
            "SELECT CAST(limit_key AS CHAR), rate_count, rate_per_us, rate_burst, tat
             FROM relayq_key_rates WHERE queue = ? ORDER BY limit_key LIMIT ?",
        )
        .bind(queue)
        .bind(listed)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(db)?;
        let num = |n: i64| u32::try_from(n).map_err(relayq_core::Error::backend);
        let default = default.map(num).transpose()?;
        let default_rate = relayq_core::kit::rate::stored(count, per, burst);
        let mut merged: std::collections::BTreeMap<String, (u64, Option<u32>, RateRow)> =
            std::collections::BTreeMap::new();
        for (k, n) in running {
            merged
                .entry(k.clone())
                .or_insert((0, None, (k, None, None, None, None)))
                .0 = n.unsigned_abs();
        }
        for (k, max) in own {
            merged
                .entry(k.clone())
                .or_insert((0, None, (k, None, None, None, None)))
                .1 = Some(num(max)?);
        }
        for r in rates {
            let entry = merged.entry(r.0.clone()).or_insert((0, None, r.clone()));
            entry.2 = r;
        }
        let mut keys = Vec::new();
        for (key, (running, own, (_, rc, rp, rb, tat))) in merged {
            let own_rate = relayq_core::kit::rate::stored(rc, rp, rb);
            let rate = own_rate.or(default_rate);
            let rate_next = rate
                .and_then(|r| relayq_core::kit::rate::next_start(&r, tat, now))
                .and_then(chrono::DateTime::from_timestamp_micros);
            if running == 0 && own.is_none() && own_rate.is_none() && rate_next.is_none() {
                continue;
            }
            keys.push(KeyUse {
                key,
                running,
                own,
                limit: own.or(default),
                own_rate,
                rate,
                rate_next,
            });
        }
        keys.truncate(relayq_core::KEYS_LISTED);
        Ok(KeyLimits {
            default,
            default_rate,
            keys,
        })
    }
}
