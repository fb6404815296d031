//! The whole conformance suite against the in-memory reference backend.

use std::sync::Arc;

use relayq_conformance::{Capability, Env, Subject};
use relayq_core::{Backend, memory::MemoryBackend};

struct Memory;

impl Subject for Memory {
    const NAME: &'static str = "memory";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    async fn open(_: Option<String>) -> anyhow::Result<Self> {
        Ok(Self)
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let backend = MemoryBackend::new();
        let shared = backend.clone();
        // Clones share the store, as connections share a database.
        Ok(Env::new(backend, move || {
            let handle: Arc<dyn Backend> = Arc::new(shared.clone());
            async move { Ok(handle) }
        }))
    }
}

relayq_conformance::suite!(Memory);
