//! SQLite's key-rate rows (SPEC K12): a maintenance pass drops those of keys under the
//! default key rate whose value lies in the past (the same as none), and keeps a key's
//! own rate.

use std::time::Duration;

use relayq_core::{Admin, Claim, ClaimRequest, Enqueue, NewJob, Rate};
use relayq_sqlite::SqliteBackend;

#[tokio::test]
async fn maintenance_drops_spent_key_rate_rows() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let b = SqliteBackend::open(&url).await.unwrap();
    let q = "krprune";
    let fast = Rate::new(1000, Duration::from_secs(1));
    let slow = Rate::new(1, Duration::from_secs(3600));
    b.set_key_rate(q, None, Some(fast)).await.unwrap();
    b.set_key_rate(q, Some("own"), Some(slow)).await.unwrap();
    let keyed = ["a", "b", "own"].map(|k| NewJob::new(q, b"x".to_vec()).limit_key(k));
    b.enqueue(keyed.to_vec()).await.unwrap();
    let lease = Duration::from_secs(60);
    assert_eq!(
        b.claim(ClaimRequest::new(q, "w", 10, lease))
            .await
            .unwrap()
            .len(),
        3
    );
    let rows = async || -> Vec<String> {
        sqlx::query_scalar("SELECT limit_key FROM relayq_key_rates WHERE queue = ?1 ORDER BY 1")
            .bind(q)
            .fetch_all(b.pool())
            .await
            .unwrap()
    };
    assert_eq!(rows().await, ["a", "b", "own"]);
    // Under 1,000 a second a key's value is a millisecond ahead.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        b.maintain(q, Duration::from_secs(3600)).await.unwrap();
        if rows().await == ["own"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rows left: {:?}",
            rows().await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
