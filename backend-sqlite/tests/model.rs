//! Model-based test: random operation sequences on SQLite and on the in-memory
//! reference model must give the same answers and leave the same states.

use std::sync::Arc;

use proptest::{prelude::*, test_runner::TestCaseError};
use relayq_conformance::model;
use relayq_core::Backend;
use relayq_sqlite::SqliteBackend;

fn url() -> String {
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("model-{}.db", std::process::id()));
    format!("sqlite://{}", file.display())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_agrees_with_the_model(ops in model::ops(40)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let subject: Arc<dyn Backend> = Arc::new(SqliteBackend::open(&url()).await?);
            model::check(model::reference(), subject, &ops).await
        })
        .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    }
}
