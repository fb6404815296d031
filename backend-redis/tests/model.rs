//! Model-based test: random operation sequences on Redis and on the in-memory reference
//! model must give the same answers and leave the same states.

use std::sync::Arc;

use proptest::{prelude::*, test_runner::TestCaseError};
use relayq_conformance::{harness::Server, model};
use relayq_core::Backend;
use relayq_redis::RedisBackend;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn redis_agrees_with_the_model(ops in model::ops(40)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let Some(url) = relayq_conformance::harness::server_url(Server::Redis).await else {
                return Ok(());
            };
            let subject = RedisBackend::connect_with_prefix(&url, "relayq-model").await?;
            let subject: Arc<dyn Backend> = Arc::new(subject);
            model::check(model::reference(), subject, &ops).await
        })
        .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    }
}
