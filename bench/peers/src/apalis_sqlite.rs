//! apalis-sqlite 1.0 on a database file of its own in a temporary directory, removed at
//! the end.

use apalis::prelude::{BackendExt, Strategy};
use apalis_sqlite::{Config, SqlitePool, SqliteStorage, callback::HookCallbackListener};
use futures::StreamExt;

use crate::{
    Args, Scenario,
    apalis_shared::{self, BATCH_SIZE, POLL, measure},
    common::{Outcome, Payload, unique},
};

pub async fn run(args: &Args) -> anyhow::Result<Outcome> {
    let dir = tempfile::tempdir()?;
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("apalis.db").display()
    );
    // The pool comes from apalis (it installs the update hook on every connection);
    // `setup` switches the file to WAL and sets its other pragmas, then migrates.
    let (pool, hook) = SqliteStorage::connect_with_callback(&url)?;
    SqliteStorage::setup(&pool).await?;
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await?;
    let queue = unique("relayq_bench");
    let config = Config::default()
        .queue(&queue)
        .batch_size(BATCH_SIZE)
        .lock_tasks(false);
    let sink = SqliteStorage::<Payload>::new(&pool).with_config(config);
    let settings = format!(
        "{}, wake-up=update hook (connect_with_callback, Strategy::stream(hook.ready_chunks(\
         batch_size))) plus a {POLL:?} interval (README 'Event-Driven Worker (Hooked)', \
         which has 500ms; see apalis_shared::POLL), temp-file database, \
         journal_mode={journal} (SqliteStorage::setup; its per-connection pragmas, \
         synchronous=OFF etc., reach only the one connection that ran it, the others keep \
         SQLite's synchronous=FULL), pool max_connections=10 (sqlx default; apalis builds \
         the pool), enqueue-batch=push_bulk (1,000 single-row INSERTs in one transaction; \
         apalis-sqlite has no multi-row insert)",
        apalis_shared::settings(args.concurrency)
    );
    let result = measure(args, sink, hook, settings).await;
    let checked = match &result {
        Ok((_, n)) => check(&pool, &queue, args.scenario, *n).await,
        Err(_) => Ok(()),
    };
    pool.close().await;
    checked?;
    result.map(|(o, _)| o)
}

async fn measure(
    args: &Args,
    sink: SqliteStorage<Payload>,
    hook: HookCallbackListener,
    settings: String,
) -> anyhow::Result<(Outcome, usize)> {
    // The README's "Event-Driven Worker (Hooked)" set-up: SQLite update hooks wake the
    // worker on every insert, with an interval poll as the fallback.
    let backend = sink.clone().poll_with_strategy(
        Strategy::new()
            .stream(hook.ready_chunks(BATCH_SIZE))
            .interval(POLL),
    );
    measure!(args, sink, backend, settings)
}

/// Every job is stored (enqueue) or stored as `Done` (worker scenarios).
async fn check(pool: &SqlitePool, queue: &str, scenario: Scenario, n: usize) -> anyhow::Result<()> {
    let worked = matches!(scenario, Scenario::Drain | Scenario::Latency);
    let found: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM Jobs WHERE job_type = ?1 AND (NOT ?2 OR status = 'Done')",
    )
    .bind(queue)
    .bind(worked)
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(
        usize::try_from(found)? == n,
        "{found} of {n} jobs {} in Jobs",
        if worked { "Done" } else { "stored" }
    );
    Ok(())
}
