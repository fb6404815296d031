//! apalis-redis 1.0. A run is isolated by a queue name of its own: every key the
//! backend writes starts with `{queue}:` (see its `Config`), and those keys are
//! unlinked at the end.

use apalis::prelude::BackendExt;
use apalis_redis::{Config, RedisStorage};
use redis::AsyncCommands;

use crate::{
    Args, Scenario,
    apalis_shared::{self, BATCH_SIZE, POLL, measure},
    common::{Outcome, Payload, unique},
};

// A plain `RedisStorage` only wakes an idle worker on its heartbeat (30 s), so it polls
// (apalis_shared::POLL). `RedisStorageFactory`'s pub/sub wake-up would not help:
// `batch_push.lua` only publishes unscheduled jobs, and `push_tasks` gives every job a
// `run_at` of at least now, so every job goes through the scheduled set unpublished.

pub async fn run(args: &Args) -> anyhow::Result<Outcome> {
    let conn = apalis_redis::connect(args.redis_url.as_str()).await?;
    let queue = unique("relayq_bench");
    let config = Config::default()
        .queue(&queue)
        .batch_size(BATCH_SIZE)
        .lock_tasks(false);
    let sink = RedisStorage::<Payload>::new(conn).with_config(config);
    let settings = format!(
        "{}, wake-up=poll_with_interval({POLL:?}), emit_events=true (default), one \
         multiplexed ConnectionManager (apalis_redis::connect), enqueue-batch=push_bulk \
         (one batch_push.lua call per 1,000)",
        apalis_shared::settings(args.concurrency)
    );
    let result = measure(args, sink, settings).await.map_err(|e| {
        if format!("{e:?}").contains("too many results to unpack") {
            e.context(
                "apalis-redis 1.0 bug: fetch_next.lua moves every due job out of the \
                 scheduled set with one unpack(), which Redis's Lua caps at about 8,000 \
                 values, and every pushed job goes through that set; so a worker facing a \
                 backlog of more than about 8,000 jobs fails",
            )
        } else {
            e
        }
    });
    let mut redis = redis::Client::open(args.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let checked = match &result {
        Ok((_, n)) => check(&mut redis, &queue, args.scenario, *n).await,
        Err(_) => Ok(()),
    };
    clean(&mut redis, &queue).await?;
    checked?;
    result.map(|(o, _)| o)
}

async fn measure(
    args: &Args,
    sink: RedisStorage<Payload>,
    settings: String,
) -> anyhow::Result<(Outcome, usize)> {
    let backend = sink.clone().poll_with_interval(POLL);
    measure!(args, sink, backend, settings)
}

/// Every job is stored (enqueue) or in the done set (worker scenarios).
async fn check(
    redis: &mut redis::aio::MultiplexedConnection,
    queue: &str,
    scenario: Scenario,
    n: usize,
) -> anyhow::Result<()> {
    let found: usize = if matches!(scenario, Scenario::Drain | Scenario::Latency) {
        redis.scard(format!("{queue}:done")).await?
    } else {
        redis.hlen(format!("{queue}:data")).await?
    };
    anyhow::ensure!(found == n, "{found} of {n} jobs found in Redis");
    Ok(())
}

async fn clean(redis: &mut redis::aio::MultiplexedConnection, queue: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = {
        let mut iter = redis.scan_match::<_, String>(format!("{queue}:*")).await?;
        let mut keys = Vec::new();
        while let Some(k) = futures::StreamExt::next(&mut iter).await {
            keys.push(k?);
        }
        keys
    };
    for chunk in keys.chunks(1000) {
        redis.unlink::<_, ()>(chunk).await?;
    }
    Ok(())
}
