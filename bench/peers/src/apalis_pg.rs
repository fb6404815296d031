//! apalis-postgres 1.0. Its tables live in the fixed `apalis` schema (1.0 moved
//! everything there, see its README), so a run is isolated by a queue (`job_type`) of
//! its own, whose rows are deleted at the end.

use apalis::prelude::BackendExt;
use apalis_postgres::{Config, PgPool, PostgresStorage};
use sqlx::postgres::PgPoolOptions;

use crate::{
    Args, Scenario,
    apalis_shared::{self, BATCH_SIZE, POLL, measure},
    common::{Outcome, Payload, unique},
};

/// Connections: the 8 enqueue tasks, plus the worker's fetch/ack, heartbeat and
/// listener; the same as relayq's own benchmark gives its PostgreSQL backend.
const POOL: u32 = 16;

pub async fn run(args: &Args) -> anyhow::Result<Outcome> {
    let pool = PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&args.postgres_url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    let queue = unique("relayq_bench");
    let config = Config::default()
        .queue(&queue)
        .batch_size(BATCH_SIZE)
        .lock_tasks(false);
    let sink = PostgresStorage::<Payload>::new(&pool).with_config(config);
    let settings = format!(
        "{}, wake-up=LISTEN/NOTIFY (with_pubsub, README 'Pubsub listener example') plus \
         poll_with_interval({POLL:?}) (examples/pubsub.rs has 10s; see apalis_shared::POLL), \
         pg pool max_connections={POOL}, enqueue-batch=push_bulk (one INSERT ... unnest \
         per 1,000, in one transaction)",
        apalis_shared::settings(args.concurrency)
    );
    let result = measure(args, sink, settings).await;
    let checked = match &result {
        Ok((_, n)) => check(&pool, &queue, args.scenario, *n).await,
        Err(_) => Ok(()),
    };
    clean(&pool, &queue).await?;
    checked?;
    result.map(|(o, _)| o)
}

async fn measure(
    args: &Args,
    sink: PostgresStorage<Payload>,
    settings: String,
) -> anyhow::Result<(Outcome, usize)> {
    let backend = sink.clone().with_pubsub().poll_with_interval(POLL);
    measure!(args, sink, backend, settings)
}

/// Every job is stored (enqueue) or stored as `Done` (worker scenarios).
async fn check(pool: &PgPool, queue: &str, scenario: Scenario, n: usize) -> anyhow::Result<()> {
    let worked = matches!(scenario, Scenario::Drain | Scenario::Latency);
    let found: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND (NOT $2 OR status = 'Done')",
    )
    .bind(queue)
    .bind(worked)
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(
        usize::try_from(found)? == n,
        "{found} of {n} jobs {} in apalis.jobs",
        if worked { "Done" } else { "stored" }
    );
    Ok(())
}

async fn clean(pool: &PgPool, queue: &str) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM apalis.jobs WHERE job_type = $1")
        .bind(queue)
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM apalis.workers WHERE worker_type = $1")
        .bind(queue)
        .execute(pool)
        .await?;
    Ok(())
}
