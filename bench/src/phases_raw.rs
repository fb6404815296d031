//! The raw `SKIP LOCKED` loop through the phases of [`crate::phases`], side by side
//! with relayq: the same producer rate, 256-byte payloads and 1 ms of work per job,
//! and 16 loops, each claiming up to 16 jobs with the `MATERIALIZED` CTE, working
//! them, and deleting them in one statement. An empty claim waits 10 ms (no wake-up
//! signal). No lease, no log, no retries: the server's floor, not a queue.

use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};

use crate::{
    Row, median,
    phases::{
        Counts, PHASES, SLOTS, TICK, as_f64, drained_after, percentile, pin, rates, sample, stamped,
    },
};

const TABLE: &str = "relayq_bench_raw_phases.jobs";

pub async fn once(url: &str, rate: u64, phase: Duration) -> anyhow::Result<Vec<Row>> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(SLOTS + 2)
        .connect(url)
        .await?;
    sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS relayq_bench_raw_phases CASCADE;
         CREATE SCHEMA relayq_bench_raw_phases;
         CREATE TABLE relayq_bench_raw_phases.jobs (
             id bigserial PRIMARY KEY, state text NOT NULL, run_at timestamptz NOT NULL,
             payload bytea NOT NULL);
         CREATE INDEX jobs_ready ON relayq_bench_raw_phases.jobs (run_at, id)
             WHERE state = 'ready';",
    )
    .execute(&pool)
    .await?;
    let counts = Arc::new(Counts::default());
    let claims = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..SLOTS {
        tasks.push(tokio::spawn(consume(
            pool.clone(),
            counts.clone(),
            claims.clone(),
        )));
    }
    tasks.push(tokio::spawn(produce(pool.clone(), rate, counts.clone())));
    let mut rows = Vec::new();
    for name in PHASES {
        let held = pin(name, url, &[TABLE.to_owned()]).await?;
        claims.lock().expect("not poisoned").clear();
        counts.take_pickups();
        let samples = sample(&counts, phase).await;
        for c in held {
            sqlx::Connection::close(c).await?;
        }
        let pickups = counts.take_pickups();
        let took: Vec<f64> = std::mem::take(&mut *claims.lock().expect("not poisoned"));
        let (mean, min) = rates(&samples);
        let backlog = samples.last().map_or(0, |s| s.1.saturating_sub(s.2));
        let mut figures = vec![
            ("done/s mean", mean, "jobs/s"),
            ("done/s min 5 s", min, "jobs/s"),
            ("claim p50", median(took.clone()), "ms"),
            ("claim p99", percentile(took, 0.99), "ms"),
            ("pickup p50", median(pickups.clone()), "ms"),
            ("pickup p99", percentile(pickups, 0.99), "ms"),
            ("backlog at end", as_f64(backlog), "jobs"),
        ];
        if name.ends_with("recovery") {
            figures.push(("backlog gone after", drained_after(&samples, rate), "s"));
        }
        let (dead, bytes) = crate::phases::jobs_table(&pool, "relayq_bench_raw_phases").await?;
        figures.push(("jobs dead rows", as_f64(dead), "rows"));
        figures.push(("jobs size", as_f64(bytes) / 1e6, "MB"));
        for (what, value, unit) in figures {
            rows.push(Row {
                scenario: format!("phases {rate}/s, {name}: {what}"),
                target: "raw-postgres".to_owned(),
                value,
                unit,
                note: String::new(),
            });
        }
    }
    for t in &tasks {
        t.abort();
    }
    sqlx::raw_sql("DROP SCHEMA relayq_bench_raw_phases CASCADE")
        .execute(&pool)
        .await?;
    Ok(rows)
}

async fn produce(pool: sqlx::PgPool, rate: u64, counts: Arc<Counts>) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let insert = format!(
        "INSERT INTO {TABLE} (state, run_at, payload)
         SELECT 'ready', now(), $2 FROM generate_series(1, $1)"
    );
    loop {
        tick.tick().await;
        let owed = u64::try_from(start.elapsed().as_millis())? * rate / 1000;
        let n = owed
            .saturating_sub(counts.enqueued.load(Ordering::Relaxed))
            .min(10_000);
        if n == 0 {
            continue;
        }
        sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
            .bind(i64::try_from(n)?)
            // One stamp for the tick's jobs: they are enqueued together.
            .bind(stamped())
            .execute(&pool)
            .await?;
        counts.enqueued.fetch_add(n, Ordering::Relaxed);
    }
}

async fn consume(
    pool: sqlx::PgPool,
    counts: Arc<Counts>,
    claims: Arc<Mutex<Vec<f64>>>,
) -> anyhow::Result<()> {
    let claim = format!(
        "WITH c AS MATERIALIZED (
             SELECT id FROM {TABLE} WHERE state = 'ready' AND run_at <= now()
             ORDER BY run_at, id LIMIT 16 FOR UPDATE SKIP LOCKED)
         UPDATE {TABLE} j SET state = 'running' FROM c WHERE j.id = c.id
         RETURNING j.id, j.payload"
    );
    let delete = format!("DELETE FROM {TABLE} WHERE id = ANY($1)");
    let mut conn = pool.acquire().await?;
    loop {
        let start = Instant::now();
        let got: Vec<(i64, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(claim.as_str()))
            .fetch_all(&mut *conn)
            .await?;
        claims
            .lock()
            .expect("not poisoned")
            .push(start.elapsed().as_secs_f64() * 1000.0);
        let ids: Vec<i64> = got.iter().map(|(id, _)| *id).collect();
        for (_, payload) in &got {
            counts.picked(payload);
        }
        if ids.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        // 1 ms of work per job, the jobs of one claim side by side.
        tokio::time::sleep(Duration::from_millis(1)).await;
        sqlx::query(sqlx::AssertSqlSafe(delete.as_str()))
            .bind(&ids)
            .execute(&mut *conn)
            .await?;
        counts
            .done
            .fetch_add(u64::try_from(ids.len())?, Ordering::Relaxed);
    }
}
