//! The whole conformance suite, and the model check, against Redis Cluster
//! (`RELAYQ_REDIS_CLUSTER_URLS`, a comma-separated list of node URLs; else reported as
//! ignored). Each case's random queue
//! names land in different slots, so the cases spread over the masters.

use std::{sync::Arc, time::Duration};

use relayq_conformance::{Capability, Env, Subject, harness::Server, runner::server_test};
use relayq_core::{Backend, EnqueueExt, EventKind, Events, NewJob};
use relayq_redis::RedisBackend;
use tokio::time::Instant;

const PREFIX: &str = "relayq-cluster";

async fn open(urls: &str) -> relayq_core::Result<RedisBackend> {
    let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
    RedisBackend::cluster(&urls, PREFIX).await
}

struct Cluster {
    urls: String,
}

impl Subject for Cluster {
    const NAME: &'static str = "redis-cluster";
    const SERVER: Option<Server> = Some(Server::of(&relayq_redis::CLUSTER_DRIVER));
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    async fn open(urls: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            urls: urls.expect("SERVER is set"),
        })
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let urls = self.urls.clone();
        let backend = open(&urls).await?;
        Ok(Env::new(backend, move || {
            let urls = urls.clone();
            async move {
                let handle: Arc<dyn Backend> = Arc::new(open(&urls).await?);
                Ok(handle)
            }
        })
        .with_unreachable(|| async {
            let url = format!(
                "redis://:{}@127.0.0.1:1",
                relayq_conformance::UNREACHABLE_PASSWORD
            );
            let handle: Arc<dyn Backend> = Arc::new(open(&url).await?);
            Ok(handle)
        }))
    }
}

relayq_conformance::suite!(
    Cluster,
    [server_test(
        Server::of(&relayq_redis::CLUSTER_DRIVER),
        "wakeups_subscribe_on_every_master",
        wakeups_subscribe_on_every_master,
    )]
);

/// Wake-ups on a cluster subscribe on every master, so a queue's `PUBLISH` reaches the
/// subscriber from its own node, not over the cluster bus (see `listen.rs`): the
/// `PUBSUB NUMSUB` half fails with one subscription. The second half, an enqueue on a
/// queue of each master waking a second handle, is the end-to-end check (the bus
/// would deliver it too, only later).
async fn wakeups_subscribe_on_every_master(urls: String) {
    let seeds: Vec<&str> = urls.split(',').map(str::trim).collect();
    let prefix = format!("relayq-ev-{}", uuid::Uuid::new_v4().simple());
    let listening = RedisBackend::cluster(&seeds, &prefix).await.unwrap();
    let producer = RedisBackend::cluster(&seeds, &prefix).await.unwrap();
    let mut rx = listening.subscribe().unwrap();
    let channel = format!("{prefix}:events");

    // The masters, and a queue whose slot each one serves.
    let seed = redis::Client::open(seeds[0]).unwrap();
    let mut conn = seed.get_multiplexed_async_connection().await.unwrap();
    let slots: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<redis::Value>>(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            let redis::Value::Array(r) = r else {
                panic!("{r:?}")
            };
            let (start, end, master) = (r[0].clone(), r[1].clone(), r[2].clone());
            let master: Vec<redis::Value> = redis::from_redis_value(master).unwrap();
            (
                redis::from_redis_value(start).unwrap(),
                redis::from_redis_value(end).unwrap(),
                (
                    redis::from_redis_value(master[0].clone()).unwrap(),
                    redis::from_redis_value(master[1].clone()).unwrap(),
                ),
            )
        })
        .collect();
    let mut masters: Vec<(String, u16)> = slots.iter().map(|s| s.2.clone()).collect();
    masters.sort();
    masters.dedup();

    let deadline = Instant::now() + Duration::from_secs(15);
    for (host, port) in &masters {
        // The seed's settings (credentials, say) with the master's address; an empty
        // host in `CLUSTER SLOTS` is the seed's own.
        let info = seed.get_connection_info().clone();
        let node_host = match (host.is_empty(), info.addr()) {
            (true, redis::ConnectionAddr::Tcp(seed_host, _)) => seed_host.clone(),
            _ => host.clone(),
        };
        let addr = redis::ConnectionAddr::Tcp(node_host, *port);
        let node = redis::Client::open(info.set_addr(addr)).unwrap();
        let mut node = node.get_multiplexed_async_connection().await.unwrap();
        loop {
            let (_, n): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut node)
                .await
                .unwrap();
            if n >= 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no subscriber on master {host}:{port}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    for master in &masters {
        let mut queue = String::new();
        for i in 0.. {
            queue = format!("ev{i}");
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(listening.queue_key(&queue))
                .query_async(&mut conn)
                .await
                .unwrap();
            let served = |(start, end, m): &(u16, u16, (String, u16))| {
                m == master && (*start..=*end).contains(&slot)
            };
            if slots.iter().any(served) {
                break;
            }
        }
        producer
            .enqueue_one(NewJob::new(&queue, b"x".to_vec()))
            .await
            .unwrap();
        loop {
            let ev = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no wake-up for {queue} on {master:?}"))
                .unwrap();
            if *ev.queue == *queue && ev.kind == EventKind::Ready {
                break;
            }
        }
    }
}
