//! Transactions and the queue locks that order them (see the crate's documentation),
//! and the first connection to a server.

use relayq_core::{Error, Result};
use sqlx::{
    Connection, MySql, MySqlConnection, QueryBuilder, Row as _, mysql::MySqlConnectOptions,
};

use crate::{MysqlBackend, db};

/// A transaction on a pooled connection.
pub(crate) type Tx = sqlx::Transaction<'static, MySql>;

/// A queue's settings, as its locked row holds them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct QueueRow {
    pub(crate) paused: bool,
    pub(crate) max_running: Option<i64>,
    /// Its rate (SPEC K8), and when the rate's next start is due.
    pub(crate) rate: Option<relayq_core::Rate>,
    pub(crate) tat: Option<i64>,
    /// Whether it has key limits or key rates (SPEC K), and the default limit.
    pub(crate) keyed: bool,
    pub(crate) key_limit: Option<i64>,
    /// Whether it has key rates (SPEC K12), and the default one.
    pub(crate) key_rated: bool,
    pub(crate) key_rate: Option<relayq_core::Rate>,
}

/// A queue's row as a claim reads it, the server's time last.
const QUEUE_ROW: &str = "SELECT paused, max_running, rate_count, rate_per_us, rate_burst,
        rate_tat, keyed, key_limit, key_rated, key_rate_count, key_rate_per_us, key_rate_burst,
        CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)
    FROM relayq_queues WHERE queue = ?";

type Row = (
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    bool,
    Option<i64>,
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
);

fn queue_row(r: Row) -> (QueueRow, i64) {
    let (paused, max_running, count, per, burst, tat, keyed, key_limit, key_rated, kc, kp, kb, now) =
        r;
    let rate = relayq_core::kit::rate::stored(count, per, burst);
    let key_rate = relayq_core::kit::rate::stored(kc, kp, kb);
    (
        QueueRow {
            paused,
            max_running,
            rate,
            tat,
            keyed,
            key_limit,
            key_rated,
            key_rate,
        },
        now,
    )
}

impl MysqlBackend {
    /// Begins a transaction that holds the rows of `queues` (made when missing)
    /// exclusively, locked in name order; returns it and the server's time, read once
    /// the locks are held (`SYSDATE`, not `NOW`: `NOW` is the statement's start, before
    /// any wait for a lock), in whole microseconds.
    pub(crate) async fn write(&self, queues: &[&str]) -> Result<(Tx, i64)> {
        self.write_with(queues, true).await
    }

    /// [`write`](Self::write), counting the write for pollers (`listen.rs`) or not (a
    /// claim, which wakes no one).
    async fn write_with(&self, queues: &[&str], count: bool) -> Result<(Tx, i64)> {
        let mut names: Vec<&str> = queues.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let mut rows = lock(&mut tx, &names, Mode::Exclusive).await?;
        if rows.len() < names.len() {
            let missing: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| !rows.iter().any(|(q, _, _)| q == n))
                .collect();
            let mut insert =
                QueryBuilder::<MySql>::new("INSERT IGNORE INTO relayq_queues (queue) ");
            insert.push_values(&missing, |mut b, q| {
                b.push_bind(*q);
            });
            insert.build().execute(&mut *tx).await.map_err(db)?;
            rows = lock(&mut tx, &names, Mode::Exclusive).await?;
        }
        let now = rows
            .last()
            .map(|r| r.2)
            .ok_or_else(|| Error::backend("a queue's row was not found after it was made"))?;
        // Counted for the handles that wake their subscribers by polling (`listen.rs`):
        // the rows are this transaction's already, so it waits for nothing.
        if !count {
            return Ok((tx, now));
        }
        let mut bump = QueryBuilder::<MySql>::new(
            "UPDATE relayq_queues SET changes = changes + 1 WHERE queue IN (",
        );
        let mut list = bump.separated(", ");
        for n in &names {
            list.push_bind(*n);
        }
        list.push_unseparated(")");
        bump.build().execute(&mut *tx).await.map_err(db)?;
        Ok((tx, now))
    }

    /// Begins a claim's transaction: the queue's row held shared (so claims run beside
    /// each other, and no write to the queue runs beside them), or exclusively when the
    /// queue has `max_running`, a rate or key limits (claims then count its running
    /// jobs, each key's, and move its rate one at a time). `None` when the queue was never written to: it has no
    /// jobs.
    pub(crate) async fn claim_lock(&self, queue: &str) -> Result<Option<(Tx, i64, QueueRow)>> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let shared = format!("{QUEUE_ROW} LOCK IN SHARE MODE");
        let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(shared))
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        let Some((row, now)) = row.map(queue_row) else {
            return Ok(None);
        };
        if (row.max_running.is_none() && row.rate.is_none() && !row.keyed) || row.paused {
            return Ok(Some((tx, now, row)));
        }
        // Upgrading would deadlock with another claimer doing the same: start over with
        // the exclusive lock, and read the row again under it.
        tx.rollback().await.map_err(db)?;
        let (mut tx, _) = self.write_with(&[queue], false).await?;
        let row: Row = sqlx::query_as(QUEUE_ROW)
            .bind(queue)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        let (row, now) = queue_row(row);
        Ok(Some((tx, now, row)))
    }

    /// The server's time, outside any transaction.
    pub(crate) async fn now(&self) -> Result<i64> {
        sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)")
            .fetch_one(&self.inner.pool)
            .await
            .map_err(db)
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Exclusive,
}

/// Locks the queues' rows that exist; each with the server's time after its lock.
async fn lock(tx: &mut Tx, names: &[&str], mode: Mode) -> Result<Vec<(String, bool, i64)>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT CAST(queue AS CHAR), paused, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)
         FROM relayq_queues WHERE queue IN (",
    );
    let mut list = q.separated(", ");
    for n in names {
        list.push_bind(*n);
    }
    q.push(") ORDER BY queue");
    match mode {
        Mode::Exclusive => q.push(" FOR UPDATE"),
    };
    let rows = q.build().fetch_all(&mut **tx).await.map_err(db)?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect::<sqlx::Result<Vec<_>>>()
        .map_err(db)
}

/// The first connection to the server, within `kit::probe`'s bound (SPEC X4).
pub(crate) async fn probe(options: &MySqlConnectOptions) -> Result<MySqlConnection> {
    let server = format!(
        "the MySQL server at {}:{}",
        options.get_host(),
        options.get_port()
    );
    relayq_core::kit::probe(&server, MySqlConnection::connect_with(options), db).await
}

/// Refuses a server this backend cannot run on ([`refusal`]).
pub(crate) async fn check_server(c: &mut MySqlConnection) -> Result<()> {
    let (version, log_bin, format): (String, i64, String) =
        sqlx::query_as("SELECT CAST(VERSION() AS CHAR), @@log_bin, CAST(@@binlog_format AS CHAR)")
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
    match refusal(&version, log_bin == 1, &format) {
        Some(why) => Err(Error::backend(why).from_backend("mysql")),
        None => Ok(()),
    }
}

/// Why a server cannot run this backend, if it cannot: MariaDB before 10.6 or MySQL
/// before 8.0.17 (no `SKIP LOCKED`, or no padless binary collation), or a binary log
/// kept as statements, which `SKIP LOCKED` makes unsafe to replay (MariaDB's error
/// 4175).
fn refusal(version: &str, log_bin: bool, format: &str) -> Option<String> {
    let mut parts = version
        .split(|ch: char| !ch.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let mariadb = version.contains("MariaDB");
    let old = if mariadb {
        (major, minor) < (10, 6)
    } else {
        (major, minor, parts.next().unwrap_or(0)) < (8, 0, 17)
    };
    if old {
        return Some(format!(
            "the server is {version}: relayq needs MariaDB 10.6 or MySQL 8.0.17 and later \
             (SKIP LOCKED, utf8mb4_0900_bin)"
        ));
    }
    if log_bin && !format.eq_ignore_ascii_case("ROW") {
        return Some(format!(
            "the server logs statements (binlog_format={format}): relayq's claims use \
             SKIP LOCKED, which only row-based logging replays safely; set \
             binlog_format=ROW"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn servers_without_skip_locked_or_a_padless_collation_are_refused() {
        for old in ["10.5.23-MariaDB", "5.7.44-log", "8.0.16"] {
            let why = refusal(old, false, "ROW").expect(old);
            assert!(why.contains(old) && why.contains("MariaDB 10.6"), "{why}");
        }
        for fine in [
            "10.6.0-MariaDB",
            "10.11.19-MariaDB-0+deb12u1",
            "8.0.17",
            "8.4.3",
            "9.1.0",
        ] {
            assert_eq!(refusal(fine, false, "ROW"), None, "{fine}");
        }
    }

    #[test]
    fn a_binary_log_of_statements_is_refused_and_one_of_rows_is_not() {
        for format in ["STATEMENT", "MIXED"] {
            let why = refusal("10.11.19-MariaDB", true, format).expect(format);
            assert!(why.contains("binlog_format=ROW"), "{why}");
        }
        assert_eq!(refusal("10.11.19-MariaDB", true, "row"), None);
        // No binary log: nothing is replayed, whatever the format says.
        assert_eq!(refusal("10.11.19-MariaDB", false, "MIXED"), None);
    }
}
