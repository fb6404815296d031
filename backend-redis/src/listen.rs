//! Pub/sub wake-ups (SPEC W2, B5): scripts `PUBLISH` `r:<queue>` (jobs became
//! claimable) or `f:<queue>` (jobs finished) on the prefix's channel; one subscriber
//! task per backend handle, started by the first subscriber, forwards them. Messages
//! are hints: after a reconnect it sends `Resync` so every waiter checks once.
//!
//! On a cluster it subscribes on every master. A `PUBLISH` reaches the publishing
//! node's own subscribers at once, but other nodes only over the cluster bus, whose
//! outgoing connections Redis (7.0 here) opens without `TCP_NODELAY`: Nagle's algorithm
//! held messages there until the receiver's delayed ACK, so wake-ups from a queue
//! whose slot lived on another node than the subscriber took 3–4 ms at p50 instead of
//! under 0.5. Each message now arrives once per master, first from its own; the
//! copies are hints like any other (the worker folds a burst of them into one wake).

use std::{collections::HashMap, time::Duration};

use futures::StreamExt;
use redis::{Client, ConnectionAddr, Value};
use relayq_core::{
    EventBus,
    kit::wake::{ListenTask, forward},
};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// How often a cluster's masters are listed again, to follow failovers and new nodes.
const RELIST: Duration = Duration::from_secs(10);

pub(crate) struct Listener {
    clients: Vec<Client>,
    cluster: bool,
    channel: String,
    events: EventBus,
    task: ListenTask,
}

impl Listener {
    /// A listener through `clients`: the server, or a cluster's seed nodes.
    pub(crate) fn new(
        clients: Vec<Client>,
        cluster: bool,
        channel: String,
        events: EventBus,
    ) -> Self {
        Self {
            clients,
            cluster,
            channel,
            events,
            task: ListenTask::default(),
        }
    }

    /// Starts the task, once, if a tokio runtime is running (otherwise callers poll).
    pub(crate) fn start(&self) {
        self.task.start(|| {
            let (clients, channel, events) = (
                self.clients.clone(),
                self.channel.clone(),
                self.events.clone(),
            );
            let cluster = self.cluster;
            async move {
                if cluster {
                    listen_cluster(clients, channel, events).await;
                } else {
                    listen(clients, channel, events).await;
                }
            }
        });
    }
}

/// Subscribes through each client in turn; on any failure, starts over with the next
/// after a backoff.
async fn listen(clients: Vec<Client>, channel: String, events: EventBus) {
    let mut backoff = Backoff::default();
    for client in clients.iter().cycle() {
        backoff.after(subscribe(client, &channel, &events)).await;
    }
}

/// Subscribes on every master the seeds name, each on its own (a master that is down
/// leaves the others subscribed), and lists the masters again every [`RELIST`]: one no
/// longer listed is let go, a new one subscribed.
async fn listen_cluster(seeds: Vec<Client>, channel: String, events: EventBus) {
    let mut subs: HashMap<(String, u16), AbortOnDropHandle<()>> = HashMap::new();
    loop {
        match tokio::time::timeout(RELIST, masters(&seeds)).await {
            Ok(Some(masters)) if !masters.is_empty() => {
                subs.retain(|addr, _| masters.iter().any(|(a, _)| a == addr));
                for (addr, client) in masters {
                    subs.entry(addr).or_insert_with(|| {
                        let (channel, events) = (channel.clone(), events.clone());
                        AbortOnDropHandle::new(tokio::spawn(async move {
                            let mut backoff = Backoff::default();
                            loop {
                                backoff.after(subscribe(&client, &channel, &events)).await;
                            }
                        }))
                    });
                }
            }
            _ => tracing::warn!(channel, "relayq cannot list the cluster's masters"),
        }
        tokio::time::sleep(RELIST).await;
    }
}

/// Subscribes through `client` and forwards messages until the connection is lost.
/// Returns whether it subscribed at all.
async fn subscribe(client: &Client, channel: &str, events: &EventBus) -> bool {
    let mut pubsub = match client.get_async_pubsub().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(channel, error = %e, "relayq subscriber cannot connect");
            return false;
        }
    };
    if let Err(e) = pubsub.subscribe(channel).await {
        tracing::warn!(channel, error = %e, "relayq SUBSCRIBE failed");
        return false;
    }
    events.resync();
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        if let Ok(payload) = msg.get_payload::<String>() {
            forward(events, &payload);
        }
    }
    tracing::debug!(channel, "relayq subscriber lost its connection");
    true
}

/// Each master of the cluster by address, with a client for it, from the first seed
/// that answers `CLUSTER SLOTS`; each client keeps its seed's settings (credentials,
/// TCP, TLS) with the master's address.
async fn masters(seeds: &[Client]) -> Option<Vec<((String, u16), Client)>> {
    for seed in seeds {
        let Ok(mut conn) = seed.get_multiplexed_async_connection().await else {
            continue;
        };
        let Ok(slots) = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(&mut conn)
            .await
        else {
            continue;
        };
        let info = seed.get_connection_info();
        let seed_host = match info.addr() {
            ConnectionAddr::Tcp(h, _) | ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
            _ => continue,
        };
        let mut addrs: Vec<(String, u16)> = master_addrs(&slots)
            .into_iter()
            // An empty host is the asked node's own (as `CLUSTER SLOTS` says); `?` is a
            // node whose address is unknown.
            .filter(|(host, _)| host != "?")
            .map(|(host, port)| {
                let host = if host.is_empty() {
                    seed_host.clone()
                } else {
                    host
                };
                (host, port)
            })
            .collect();
        addrs.sort();
        addrs.dedup();
        let with_client = |(host, port): (String, u16)| {
            let mut addr = info.addr().clone();
            match &mut addr {
                ConnectionAddr::Tcp(h, p)
                | ConnectionAddr::TcpTls {
                    host: h, port: p, ..
                } => {
                    h.clone_from(&host);
                    *p = port;
                }
                _ => return None,
            }
            let client = Client::open(info.clone().set_addr(addr)).ok()?;
            Some(((host, port), client))
        };
        return Some(addrs.into_iter().filter_map(with_client).collect());
    }
    None
}

/// The (host, port) of each slot range's master in a `CLUSTER SLOTS` reply: entries of
/// `[start, end, [host, port, id, ...], replicas...]`.
fn master_addrs(slots: &Value) -> Vec<(String, u16)> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(range) = range else {
                return None;
            };
            let Some(Value::Array(master)) = range.get(2) else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let Value::Int(port) = master.get(1)? else {
                return None;
            };
            Some((host, u16::try_from(*port).ok()?))
        })
        .collect()
}

/// The wait before subscribing again: 20 ms, doubling to 2 s; back to 20 ms only after
/// a subscription that held a while, so a node that takes the subscription and drops
/// it at once is not asked again every 20 ms.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(20))
    }
}

impl Backoff {
    /// Runs `subscription` (true if it subscribed), then waits.
    async fn after(&mut self, subscription: impl Future<Output = bool>) {
        let start = Instant::now();
        if subscription.await && start.elapsed() >= Duration::from_secs(5) {
            *self = Self::default();
        }
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn masters_are_read_from_cluster_slots() {
        let range = |start, end, host: &str, port, replica_port| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk(host), Value::Int(replica_port), bulk("id2")]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, "10.0.0.1", 7000, 7100),
            range(5461, 10922, "", 7001, 7101),
            range(10923, 16383, "10.0.0.1", 7000, 7100),
        ]);
        assert_eq!(
            master_addrs(&reply),
            [
                ("10.0.0.1".to_owned(), 7000),
                (String::new(), 7001),
                ("10.0.0.1".to_owned(), 7000)
            ]
        );
        assert!(master_addrs(&Value::Nil).is_empty());
    }
}
