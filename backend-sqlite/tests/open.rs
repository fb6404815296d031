//! Opening one new file from many handles at once: WAL switch and migrations must not
//! race (each ran into "database is locked" / "table already exists" before).

use relayq_core::Inspect;
use relayq_sqlite::SqliteBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_handles_open_a_new_file_at_once() {
    for round in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
        let opens: Vec<_> = (0..32)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { SqliteBackend::open(&url).await })
            })
            .collect();
        for open in opens {
            let backend = open
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(backend.queue_stats("q").await.unwrap().total(), 0);
        }
    }
}
