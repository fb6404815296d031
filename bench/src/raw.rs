//! The raw limits: the least a queue on each server must do, with none of relayq's
//! guarantees (no lease tokens, attempts, log, groups or stages), drained by 16 loops.
//!
//! - PostgreSQL: claim 50 with the `MATERIALIZED` CTE and `FOR UPDATE SKIP LOCKED`,
//!   then one `DELETE ... WHERE id = ANY($1)` for the 50, each loop on a connection of
//!   its own.
//! - Redis: one script pops 50 with `ZPOPMIN` (and marks them running), one script
//!   acknowledges the 50.
//! - MariaDB/MySQL: in a transaction at READ COMMITTED, `SELECT ... FOR UPDATE SKIP
//!   LOCKED` of 50 on `(queue, state, priority, run_at, id)`, then one `UPDATE` of the
//!   50 by id; then one `DELETE` of the 50, each loop on a connection of its own.

use std::time::Instant;

use redis::Script;

use crate::{Row, median, targets::Target};

const LOOPS: usize = 16;

pub async fn loops(targets: &[Target], n: usize, runs: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for t in targets {
        let mut samples = Vec::new();
        for _ in 0..runs {
            samples.push(match t {
                Target::Postgres(url) => postgres(url, n).await?,
                Target::Redis(url) => redis_loop(url, n).await?,
                Target::Other(driver, url) if driver.name == "mysql" => mysql(url, n).await?,
                _ => continue,
            });
        }
        if !samples.is_empty() {
            rows.push(Row {
                scenario: format!("raw drain, {LOOPS} loops of 50"),
                target: t.label().to_owned(),
                value: median(samples),
                unit: "jobs/s",
                note: String::new(),
            });
        }
    }
    Ok(rows)
}

#[allow(clippy::cast_precision_loss)]
async fn postgres(url: &str, n: usize) -> anyhow::Result<f64> {
    crate::targets::vacuum(url).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(LOOPS)? + 1)
        .connect(url)
        .await?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS relayq_bench_raw;
         CREATE TABLE IF NOT EXISTS relayq_bench_raw.jobs (
             id bigserial PRIMARY KEY, queue text NOT NULL, state text NOT NULL,
             priority smallint NOT NULL, run_at timestamptz NOT NULL, payload bytea NOT NULL);
         CREATE INDEX IF NOT EXISTS jobs_ready ON relayq_bench_raw.jobs
             (queue, priority, run_at, id) WHERE state = 'ready';",
    )
    .execute(&pool)
    .await?;
    let q = format!("raw-{}", std::process::id());
    sqlx::query(
        "INSERT INTO relayq_bench_raw.jobs (queue, state, priority, run_at, payload)
         SELECT $1, 'ready', 0, now(), convert_to(repeat('x', 100), 'UTF8')
         FROM generate_series(1, $2)",
    )
    .bind(&q)
    .bind(i64::try_from(n)?)
    .execute(&pool)
    .await?;
    // One connection per loop, opened before the clock starts and held throughout: a
    // minimal loop pays no pool check or release round trip per statement.
    let mut conns = Vec::with_capacity(LOOPS);
    for _ in 0..LOOPS {
        conns.push(pool.acquire().await?);
    }
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let q = q.clone();
            tokio::spawn(async move {
                loop {
                    let ids: Vec<i64> = sqlx::query_scalar(
                        "WITH c AS MATERIALIZED (
                             SELECT id FROM relayq_bench_raw.jobs
                             WHERE queue = $1 AND state = 'ready' AND run_at <= now()
                             ORDER BY priority, run_at, id LIMIT 50
                             FOR UPDATE SKIP LOCKED)
                         UPDATE relayq_bench_raw.jobs j SET state = 'running'
                         FROM c WHERE j.id = c.id RETURNING j.id",
                    )
                    .bind(&q)
                    .fetch_all(&mut *conn)
                    .await?;
                    if ids.is_empty() {
                        return anyhow::Ok(());
                    }
                    sqlx::query("DELETE FROM relayq_bench_raw.jobs WHERE id = ANY($1)")
                        .bind(&ids)
                        .execute(&mut *conn)
                        .await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

#[allow(clippy::cast_precision_loss)]
async fn mysql(url: &str, n: usize) -> anyhow::Result<f64> {
    use sqlx::Executor as _;
    let base = url.split('?').next().unwrap_or(url);
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(u32::try_from(LOOPS)? + 1)
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                Ok(())
            })
        })
        .connect(base)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS relayq_bench_raw_jobs (
             id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(128) NOT NULL,
             state VARCHAR(16) NOT NULL, priority INT NOT NULL, run_at DATETIME(6) NOT NULL,
             payload BLOB NOT NULL,
             KEY jobs_ready (queue, state, priority, run_at, id)) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await?;
    let q = format!("raw-{}", std::process::id());
    for chunk in 0..n.div_ceil(1000) {
        let size = (n - chunk * 1000).min(1000);
        let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO relayq_bench_raw_jobs (queue, state, priority, run_at, payload) ",
        );
        insert.push_values(0..size, |mut b, _| {
            b.push_bind(&q)
                .push("'ready', 0, NOW(6)")
                .push_bind(vec![b'x'; 100]);
        });
        insert.build().execute(&pool).await?;
    }
    let mut conns = Vec::with_capacity(LOOPS);
    for _ in 0..LOOPS {
        conns.push(pool.acquire().await?);
    }
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let q = q.clone();
            tokio::spawn(async move {
                loop {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let ids: Vec<i64> = sqlx::query_scalar(
                        "SELECT id FROM relayq_bench_raw_jobs
                         WHERE queue = ? AND state = 'ready' AND run_at <= NOW(6)
                         ORDER BY priority, run_at, id LIMIT 50
                         FOR UPDATE SKIP LOCKED",
                    )
                    .bind(&q)
                    .fetch_all(&mut *tx)
                    .await?;
                    if ids.is_empty() {
                        tx.commit().await?;
                        return anyhow::Ok(());
                    }
                    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                    // The ids are this loop's own numbers, written into the text.
                    let set = format!(
                        "UPDATE relayq_bench_raw_jobs SET state = 'running' WHERE id IN ({list})"
                    );
                    sqlx::raw_sql(sqlx::AssertSqlSafe(set))
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    let delete = format!("DELETE FROM relayq_bench_raw_jobs WHERE id IN ({list})");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(delete))
                        .execute(&mut *conn)
                        .await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

#[allow(clippy::cast_precision_loss)]
async fn redis_loop(url: &str, n: usize) -> anyhow::Result<f64> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let base = format!("relayq-bench-raw:{{raw-{}}}", std::process::id());
    let fill = Script::new(
        "for i = tonumber(ARGV[3]) + 1, tonumber(ARGV[3]) + tonumber(ARGV[1]) do
             redis.call('ZADD', KEYS[1] .. ':ready', 0, i)
             redis.call('SET', KEYS[1] .. ':job:' .. i, ARGV[2])
         end",
    );
    // Ids continue across chunks (they used to restart at 1, so only 10,000 distinct
    // jobs existed and the rate came out up to 5x too high).
    for chunk in 0..n.div_ceil(10_000) {
        let size = (n - chunk * 10_000).min(10_000);
        let _: () = fill
            .key(&base)
            .arg(size)
            .arg(vec![b'x'; 100])
            .arg(chunk * 10_000)
            .invoke_async(&mut conn)
            .await?;
    }
    let claim = Script::new(
        "local t = redis.call('TIME')
         local popped = redis.call('ZPOPMIN', KEYS[1] .. ':ready', 50)
         local out = {}
         for i = 1, #popped, 2 do
             redis.call('ZADD', KEYS[1] .. ':running', t[1], popped[i])
             out[#out + 1] = popped[i]
             out[#out + 1] = redis.call('GET', KEYS[1] .. ':job:' .. popped[i])
         end
         return out",
    );
    let ack = Script::new(
        "for i = 1, #ARGV do
             redis.call('ZREM', KEYS[1] .. ':running', ARGV[i])
             redis.call('DEL', KEYS[1] .. ':job:' .. ARGV[i])
         end",
    );
    let start = Instant::now();
    let tasks: Vec<_> = (0..LOOPS)
        .map(|_| {
            let (mut conn, base, claim, ack) =
                (conn.clone(), base.clone(), claim.clone(), ack.clone());
            tokio::spawn(async move {
                loop {
                    let got: Vec<Vec<u8>> = claim.key(&base).invoke_async(&mut conn).await?;
                    if got.is_empty() {
                        return anyhow::Ok(());
                    }
                    let mut inv = ack.key(&base);
                    for id in got.iter().step_by(2) {
                        inv.arg(id.as_slice());
                    }
                    let _: () = inv.invoke_async(&mut conn).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
