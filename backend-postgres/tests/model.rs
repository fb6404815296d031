//! Model-based test: random operation sequences on PostgreSQL and on the in-memory
//! reference model must give the same answers and leave the same states.

use std::sync::Arc;

use proptest::{prelude::*, test_runner::TestCaseError};
use relayq_conformance::{harness::Server, model};
use relayq_core::Backend;
use relayq_postgres::{Config, PostgresBackend};

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn postgres_agrees_with_the_model(ops in model::ops(40)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let Some(url) = relayq_conformance::harness::server_url(Server::Postgres).await else {
                return Ok(());
            };
            let schema = format!("relayq_model_v{}", relayq_postgres::SCHEMA_VERSION);
            let config = Config::default().with_schema(schema).with_max_connections(2);
            let subject = PostgresBackend::connect_with(&url, config).await?;
            subject.migrate().await?;
            let subject: Arc<dyn Backend> = Arc::new(subject);
            model::check(model::reference(), subject, &ops).await
        })
        .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    }
}
