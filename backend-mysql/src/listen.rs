//! SPEC W2, B5: wake-ups. MySQL cannot notify, so every write to a queue counts itself
//! in its queue's row (`relayq_queues.changes`, bumped under the row lock the write
//! holds anyway, so it adds no contention), and one task per handle, started by its
//! first subscriber, reads the counters and sends `Ready` and `Finished` for each queue
//! whose counter moved. It polls every 20 ms while queues change and backs off to a
//! quarter of a second when they do not, so an idle handle costs four small reads a
//! second.

use std::{collections::HashMap, sync::Arc, time::Duration};

use relayq_core::{EventBus, EventKind};
use sqlx::MySqlPool;

/// The poll's interval while queues change.
const FAST: Duration = Duration::from_millis(20);
/// The poll's interval when nothing changed for a while.
const SLOW: Duration = Duration::from_millis(250);

/// Every queue's counter of writes.
const CHANGES: &str = "SELECT CAST(queue AS CHAR), changes FROM relayq_queues";

/// Polls the counters until the handle is dropped (the task is aborted then).
pub(crate) async fn poll(pool: MySqlPool, events: Arc<EventBus>) {
    let mut seen: Option<HashMap<String, i64>> = None;
    let mut wait = FAST;
    loop {
        match sqlx::query_as::<_, (String, i64)>(CHANGES)
            .fetch_all(&pool)
            .await
        {
            Ok(rows) => {
                let now: HashMap<String, i64> = rows.into_iter().collect();
                let mut moved = false;
                if let Some(before) = &seen {
                    for (queue, n) in &now {
                        if before.get(queue) != Some(n) {
                            moved = true;
                            events.notify(queue, EventKind::Ready);
                            events.notify(queue, EventKind::Finished);
                        }
                    }
                } else {
                    // The first read after a start or a failure: whatever happened
                    // meanwhile, every waiter checks once.
                    events.resync();
                }
                seen = Some(now);
                wait = if moved { FAST } else { (wait * 2).min(SLOW) };
            }
            Err(e) => {
                tracing::debug!(error = %e, "relayq-mysql: reading the queues' changes failed");
                seen = None;
                wait = SLOW;
            }
        }
        tokio::time::sleep(wait).await;
    }
}
