//! The claim's scan must use the partial claim index, never a table scan.

use relayq_sqlite::SqliteBackend;

#[tokio::test]
async fn claim_scan_uses_the_claim_index() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("plan.db").display());
    let backend = SqliteBackend::open(&url).await.unwrap();
    // The inner SELECT of the claim statement in src/claim.rs.
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN SELECT id FROM relayq_jobs
         WHERE queue = ?1 AND state IN ('ready', 'retrying') AND run_at <= ?2
         ORDER BY priority, run_at, id LIMIT ?3",
    )
    .bind("q")
    .bind(0_i64)
    .bind(10_i64)
    .fetch_all(backend.pool())
    .await
    .unwrap();
    let detail: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
    assert!(
        detail
            .iter()
            .any(|d| d.contains("USING INDEX relayq_jobs_claim")),
        "claim does not use the claim index: {detail:?}"
    );
    assert!(
        !detail.iter().any(|d| d.contains("TEMP B-TREE")),
        "claim sorts instead of reading the index in order: {detail:?}"
    );
}
