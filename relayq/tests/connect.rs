//! `relayq::connect` opens what a URL names, and says clearly what it cannot.

use relayq::prelude::*;

#[tokio::test]
async fn memory_and_sqlite_urls_open_working_backends() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("sqlite://{}", dir.path().join("q.db").display());
    for url in ["memory://", file.as_str()] {
        let b = relayq::connect(url).await.unwrap();
        b.enqueue_one(NewJob::new("mail", b"hi".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            b.queue_stats("mail").await.unwrap().count(JobState::Ready),
            1,
            "{url}"
        );
    }
}

#[tokio::test]
async fn bad_urls_are_refused_naming_the_field() {
    for url in ["relayq.db", "ftp://host/x", ""] {
        let err = relayq::connect(url).await.err().expect(url);
        assert_eq!(err.invalid_field(), Some("url"), "{url}: {err}");
    }
    let err = relayq::connect("ftp://x").await.err().unwrap();
    assert!(err.to_string().contains("memory://"), "{err}");
}

/// Server schemes pointed at a port nobody listens on: a transient error naming the
/// refusal, within a few seconds, and never a message with the password in it.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test]
async fn a_refused_server_gives_a_transient_error_without_the_password() {
    for url in [
        "postgres://u:s3cretpw@127.0.0.1:1/db",
        "redis://:s3cretpw@127.0.0.1:1",
    ] {
        let start = std::time::Instant::now();
        let err = relayq::connect(url).await.err().expect(url);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(6),
            "{url}: {err}"
        );
        assert!(err.is_transient(), "{url}: {err}");
        assert!(err.to_string().contains("refused"), "{url}: {err}");
        assert!(
            !format!("{err} {err:?}").contains("s3cretpw"),
            "{url}: {err}"
        );
    }
}

#[cfg(not(feature = "mssql"))]
#[tokio::test]
async fn a_backend_left_out_of_the_build_names_its_feature() {
    let err = relayq::connect("mssql://sa:pw@127.0.0.1:1433/db")
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("`mssql` feature"), "{err}");
}
