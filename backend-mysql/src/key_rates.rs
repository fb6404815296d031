//! SPEC K12–K14: rates of limit keys. A key's own rate, or the queue's default for
//! every key without one, judged in the keyed claim (`keys.rs`) by
//! `kit::keys::KeyAdmission` on the server's clock. A key held by its rate has its
//! waiting jobs parked and a wake time; the first claim after it puts back up to the
//! key's burst of them.

use relayq_core::{Rate, Result, kit::keys::KeyAdmission};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, MysqlBackend, db};

/// The keys whose wake time has come (SPEC K13).
const WOKEN: &str = "SELECT CAST(limit_key AS CHAR), rate_count, rate_per_us, rate_burst, tat
    FROM relayq_key_rates WHERE queue = ? AND wake_at <= ?";

/// A key's rate moved by a claim: its next start, and when its parked jobs go back.
const MOVED: &str = "INSERT INTO relayq_key_rates (queue, limit_key, tat, wake_at)
    VALUES (?, ?, ?, ?)
    ON DUPLICATE KEY UPDATE tat = COALESCE(VALUES(tat), tat),
                            wake_at = COALESCE(VALUES(wake_at), wake_at)";

/// A woken key with jobs still parked: its next wake.
const STILL_PARKED: &str = "UPDATE relayq_key_rates SET wake_at = ?
    WHERE queue = ? AND limit_key = ? AND wake_at IS NULL";

/// A key's stored rate state, as a claim reads it.
pub(crate) struct KeyRate {
    pub(crate) key: String,
    own: Option<Rate>,
    pub(crate) tat: Option<i64>,
}

impl KeyRate {
    /// Its own rate, else the queue's default.
    pub(crate) fn rate(&self, default: Option<Rate>) -> Option<Rate> {
        self.own.or(default)
    }
}

type Row = (String, Option<i64>, Option<i64>, Option<i64>, Option<i64>);

fn key_rate((key, count, per, burst, tat): Row) -> KeyRate {
    KeyRate {
        key,
        own: relayq_core::kit::rate::stored(count, per, burst),
        tat,
    }
}

/// The keys among `keys` with a row: their own rate and state.
pub(crate) async fn stored(c: &mut Conn, queue: &str, keys: &[&str]) -> Result<Vec<KeyRate>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT CAST(limit_key AS CHAR), rate_count, rate_per_us, rate_burst, tat
         FROM relayq_key_rates WHERE queue = ",
    );
    q.push_bind(queue).push(" AND limit_key IN (");
    let mut list = q.separated(", ");
    for k in keys {
        list.push_bind(*k);
    }
    list.push_unseparated(")");
    let rows: Vec<Row> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
    Ok(rows.into_iter().map(key_rate).collect())
}

/// SPEC K13: puts back up to each woken key's burst of parked jobs and clears its wake.
pub(crate) async fn wake(
    c: &mut Conn,
    queue: &str,
    now: i64,
    default: Option<Rate>,
) -> Result<Vec<KeyRate>> {
    let woken: Vec<Row> = sqlx::query_as(WOKEN)
        .bind(queue)
        .bind(now)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let woken: Vec<KeyRate> = woken.into_iter().map(key_rate).collect();
    for k in &woken {
        let burst = k.rate(default).map_or(1, |r| i64::from(r.burst));
        let first: Vec<i64> = sqlx::query_scalar(crate::keys::PARKED_FIRST)
            .bind(queue)
            .bind(&k.key)
            .bind(burst)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        crate::keys::unpark(c, &first).await?;
        sqlx::query("UPDATE relayq_key_rates SET wake_at = NULL WHERE queue = ? AND limit_key = ?")
            .bind(queue)
            .bind(&k.key)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(woken)
}

/// After a keyed claim: stores what its admission moved, gives woken keys with jobs
/// still parked their next wake, and returns the earliest wake when the claim came
/// back short (`Claimed::wake_in`).
pub(crate) async fn after_claim(
    c: &mut Conn,
    queue: &str,
    admission: &KeyAdmission,
    woken: Vec<KeyRate>,
    default: Option<Rate>,
    short: bool,
    now: i64,
) -> Result<Option<std::time::Duration>> {
    for change in admission.rated() {
        sqlx::query(MOVED)
            .bind(queue)
            .bind(&change.key)
            .bind(change.tat)
            .bind(change.wake)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    for k in woken {
        let Some(at) = k
            .rate(default)
            .and_then(|rate| admission.wake_again(&k.key, &rate, k.tat))
        else {
            continue;
        };
        let parked: Option<i64> = sqlx::query_scalar(crate::keys::PARKED_FIRST)
            .bind(queue)
            .bind(&k.key)
            .bind(1_i64)
            .fetch_optional(&mut *c)
            .await
            .map_err(db)?;
        if parked.is_none() {
            continue;
        }
        sqlx::query(STILL_PARKED)
            .bind(at)
            .bind(queue)
            .bind(&k.key)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    if !short {
        return Ok(None);
    }
    let next: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(wake_at) FROM relayq_key_rates WHERE queue = ? AND wake_at IS NOT NULL",
    )
    .bind(queue)
    .fetch_one(&mut *c)
    .await
    .map_err(db)?;
    Ok(next.map(|at| std::time::Duration::from_micros((at - now).max(0).unsigned_abs())))
}

impl MysqlBackend {
    /// SPEC K12: stores a key's own rate (`key` `None`: the default of every key
    /// without one), under the queue's lock. A new rate starts afresh, the same rate
    /// set again keeps its state; the parked jobs it concerns go back to the claim
    /// index, and the next claim parks again those still held.
    pub(crate) async fn set_key_rate_once(
        &self,
        queue: &str,
        key: Option<&str>,
        rate: Option<Rate>,
    ) -> Result<()> {
        let (mut tx, _) = self.write(&[queue]).await?;
        let count = rate.map(|r| i64::from(r.count));
        let per = rate.map(|r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX));
        let burst = rate.map(|r| i64::from(r.burst));
        type Stored = (Option<i64>, Option<i64>, Option<i64>);
        let was: Stored = match key {
            None => sqlx::query_as(
                "SELECT key_rate_count, key_rate_per_us, key_rate_burst
                 FROM relayq_queues WHERE queue = ?",
            )
            .bind(queue),
            Some(key) => sqlx::query_as(
                "SELECT rate_count, rate_per_us, rate_burst FROM relayq_key_rates
                 WHERE queue = ? AND limit_key = ?",
            )
            .bind(queue)
            .bind(key),
        }
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .unwrap_or_default();
        if was == (count, per, burst) {
            return tx.commit().await.map_err(db);
        }
        match key {
            // A new default starts afresh for every key under it: their rows go.
            None => {
                sqlx::query(
                    "UPDATE relayq_queues
                     SET key_rate_count = ?, key_rate_per_us = ?, key_rate_burst = ?
                     WHERE queue = ?",
                )
                .bind(count)
                .bind(per)
                .bind(burst)
                .bind(queue)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
                sqlx::query("DELETE FROM relayq_key_rates WHERE queue = ? AND rate_count IS NULL")
                    .bind(queue)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            Some(key) if rate.is_some() => {
                sqlx::query(
                    "INSERT INTO relayq_key_rates
                         (queue, limit_key, rate_count, rate_per_us, rate_burst)
                     VALUES (?, ?, ?, ?, ?)
                     ON DUPLICATE KEY UPDATE rate_count = VALUES(rate_count),
                         rate_per_us = VALUES(rate_per_us), rate_burst = VALUES(rate_burst),
                         tat = NULL, wake_at = NULL",
                )
                .bind(queue)
                .bind(key)
                .bind(count)
                .bind(per)
                .bind(burst)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            Some(key) => {
                sqlx::query("DELETE FROM relayq_key_rates WHERE queue = ? AND limit_key = ?")
                    .bind(queue)
                    .bind(key)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
        }
        crate::keys::unpark_all(&mut tx, queue, key).await?;
        crate::keys::refresh_keyed(&mut tx, queue).await?;
        tx.commit().await.map_err(db)
    }
}
