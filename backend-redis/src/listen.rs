//! Pub/sub wake-ups (SPEC W2, B5): scripts `PUBLISH` `r:<queue>` (jobs became
//! claimable) or `f:<queue>` (jobs finished) on the prefix's channel; one subscriber
//! task per backend handle, started by the first subscriber, forwards them. Messages
//! are hints: after a reconnect it sends `Resync` so every waiter checks once.

use std::{sync::OnceLock, time::Duration};

use futures::StreamExt;
use redis::Client;
use relayq_core::{EventBus, EventKind};
use tokio_util::task::AbortOnDropHandle;

pub(crate) struct Listener {
    clients: Vec<Client>,
    channel: String,
    events: EventBus,
    task: OnceLock<Option<AbortOnDropHandle<()>>>,
}

impl Listener {
    pub(crate) fn new(clients: Vec<Client>, channel: String, events: EventBus) -> Self {
        Self {
            clients,
            channel,
            events,
            task: OnceLock::new(),
        }
    }

    /// Starts the task, once, if a tokio runtime is running (otherwise callers poll).
    pub(crate) fn start(&self) {
        self.task.get_or_init(|| {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            let run = listen(
                self.clients.clone(),
                self.channel.clone(),
                self.events.clone(),
            );
            Some(AbortOnDropHandle::new(handle.spawn(run)))
        });
    }
}

/// Subscribes through each node in turn (on a cluster, `PUBLISH` reaches every node);
/// on any failure, starts over after a short backoff.
async fn listen(clients: Vec<Client>, channel: String, events: EventBus) {
    let mut backoff = Duration::from_millis(20);
    for client in clients.iter().cycle() {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    backoff = Duration::from_millis(20);
                    events.resync();
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if let Ok(payload) = msg.get_payload::<String>() {
                            forward(&events, &payload);
                        }
                    }
                    tracing::debug!(channel, "relayq subscriber lost its connection");
                }
                Err(e) => tracing::warn!(channel, error = %e, "relayq SUBSCRIBE failed"),
            },
            Err(e) => tracing::warn!(channel, error = %e, "relayq subscriber cannot connect"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn forward(events: &EventBus, payload: &str) {
    match payload.split_once(':') {
        Some(("r", queue)) => events.notify(queue, EventKind::Ready),
        Some(("f", queue)) => events.notify(queue, EventKind::Finished),
        _ => tracing::debug!(payload, "ignoring an unknown relayq message"),
    }
}
