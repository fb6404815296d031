//! The whole conformance suite against the in-memory reference backend.

use std::sync::Arc;

use relayq_conformance::Env;
use relayq_core::{Backend, memory::MemoryBackend};

#[allow(clippy::unused_async)]
async fn env() -> Option<Env> {
    let backend = MemoryBackend::new();
    let shared = backend.clone();
    // Clones share the store, as connections share a database.
    Some(Env::new(backend, move || {
        let handle: Arc<dyn Backend> = Arc::new(shared.clone());
        async move { Ok(handle) }
    }))
}

relayq_conformance::suite!(env);
