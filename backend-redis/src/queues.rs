//! The queues in use (SPEC M4) and the maintenance lock (SPEC M3).
//!
//! A queue's keys live in its own cluster slot, so no script can see every queue. A set
//! `<prefix>:queues` names them: each handle adds a queue the first time it enqueues,
//! opens a batch or changes a setting there, with one `SADD` outside the script (a
//! name is never removed: a queue whose jobs were all pruned stays listed).

use std::time::Duration;

use relayq_core::{Maintenance, Result};

use crate::{RedisBackend, db};

/// How long a maintenance lock outlives a holder that died mid-pass.
const MAINTENANCE_LOCK: Duration = Duration::from_secs(60);

/// Deletes the lock only when it still holds this holder's token.
const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

impl RedisBackend {
    /// The set naming every queue in use.
    fn queues_key(&self) -> String {
        format!("{}:queues", self.prefix())
    }

    /// Adds `queue` to the set, once per handle.
    pub(crate) async fn register(&self, queue: &str) -> Result<()> {
        if self
            .inner
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(queue)
        {
            return Ok(());
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.queues_key()).arg(queue);
        self.query::<i64>(&cmd).await.map_err(db)?;
        self.inner
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(queue.to_owned());
        Ok(())
    }

    /// Every queue named in the set, sorted.
    pub(crate) async fn registered(&self) -> Result<Vec<String>> {
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(self.queues_key());
        let mut names: Vec<String> = self.query(&cmd).await.map_err(db)?;
        names.sort();
        Ok(names)
    }

    /// The key a maintenance pass over `queue` holds, in the queue's slot:
    /// `<prefix>:{<queue>}:maintaining`.
    #[must_use]
    pub fn maintenance_lock_key(&self, queue: &str) -> String {
        format!("{}:maintaining", self.queue_key(queue))
    }

    /// `maintain` under the queue's lock: `None` when another pass holds it. A holder
    /// that dies mid-pass leaves the lock to expire after a minute.
    pub(crate) async fn maintain_locked(
        &self,
        queue: &str,
        retention: Duration,
    ) -> Result<Option<Maintenance>> {
        use relayq_core::Admin;
        let key = self.maintenance_lock_key(queue);
        let token = uuid::Uuid::new_v4().to_string();
        let mut lock = redis::cmd("SET");
        lock.arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(MAINTENANCE_LOCK.as_millis() as u64);
        let got: Option<String> = self.query(&lock).await.map_err(db)?;
        if got.is_none() {
            return Ok(None);
        }
        let pass = self.maintain(queue, retention).await;
        let unlock = redis::Script::new(UNLOCK);
        let mut inv = unlock.prepare_invoke();
        inv.key(&key).arg(&token);
        let unlocked: redis::RedisResult<i64> = match self.inner.conn.clone() {
            crate::Conn::Single(mut c) => inv.invoke_async(&mut c).await,
            crate::Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
        };
        // A pass that ran is reported even when the unlock failed: the lock expires.
        let m = pass?;
        if let Err(e) = unlocked {
            tracing::debug!(queue, error = %e, "maintenance lock not released; it expires");
        }
        Ok(Some(m))
    }
}
