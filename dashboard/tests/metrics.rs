//! `/metrics`: the queue gauges as Prometheus text, through the recorder the program
//! installed.

mod common;

use common::*;
use relayq_core::{EnqueueExt, NewJob};
use relayq_dashboard::{Options, router};

#[tokio::test]
async fn metrics_serve_queue_gauges() {
    // The one global recorder of this test binary.
    let handle = relayq_dashboard::prometheus().install_recorder().unwrap();
    relayq_dashboard::describe_metrics();
    let db = sqlite().await;
    let q = queue();
    for _ in 0..2 {
        db.backend
            .enqueue_one(NewJob::new(&q, b"x".to_vec()))
            .await
            .unwrap();
    }
    dead_job(db.backend.as_ref(), &q, "p", "e").await;
    db.backend.pause(&q).await.unwrap();
    // A queue the options do not name: its gauges are exported all the same.
    let elsewhere = queue();
    dead_job(db.backend.as_ref(), &elsewhere, "p", "e").await;
    db.backend.pause(&elsewhere).await.unwrap();
    let app = router(
        db.backend.clone(),
        Options {
            queues: vec![q.clone()],
            metrics: Some(handle),
            ..Options::default()
        },
    );
    let ready = format!(r#"relayq_queue_jobs{{queue="{q}",state="ready"}}"#);
    let dead_elsewhere = format!(r#"relayq_queue_jobs{{queue="{elsewhere}",state="dead"}}"#);
    let answer = get_until(&app, "/metrics", |a| {
        a.body.contains(&ready) && a.body.contains(&dead_elsewhere)
    })
    .await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = answer.body;
    for line in [
        format!(r#"relayq_queue_jobs{{queue="{q}",state="ready"}} 2"#),
        format!(r#"relayq_queue_jobs{{queue="{q}",state="dead"}} 1"#),
        format!(r#"relayq_queue_jobs{{queue="{q}",state="running"}} 0"#),
        format!(r#"relayq_queue_paused{{queue="{q}"}} 1"#),
        format!(r#"relayq_queue_max_running{{queue="{q}"}} 0"#),
        format!(r#"relayq_queue_jobs{{queue="{elsewhere}",state="dead"}} 1"#),
        format!(r#"relayq_queue_paused{{queue="{elsewhere}"}} 1"#),
        "relayq_queues_in_use 2".to_owned(),
        "relayq_queues_not_exported 0".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // Each series says what it counts, once: the queue gauges are written at each scrape
    // and nothing else writes them.
    for help in [
        "# HELP relayq_queue_jobs Jobs of the queue in each state.",
        "# HELP relayq_queue_paused 1 when the queue is paused, else 0.",
    ] {
        assert_eq!(
            text.lines().filter(|l| *l == help).count(),
            1,
            "{help:?} in\n{text}"
        );
    }
    let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let unique: std::collections::HashSet<&str> =
        text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    assert_eq!(families, unique.len(), "a family twice in\n{text}");
    // The counts' age is there, for every exported queue.
    for queue in [&q, &elsewhere] {
        let age = value(
            &text,
            &format!(r#"relayq_queue_counted_seconds_ago{{queue="{queue}"}}"#),
        );
        assert!((0.0..60.0).contains(&age), "{age}");
    }
    // Two ready jobs wait: the gauge holds a wait of zero seconds or more.
    let waited = value(
        &text,
        &format!(r#"relayq_queue_oldest_ready_seconds{{queue="{q}"}}"#),
    );
    assert!(waited >= 0.0, "{waited}");

    // A drained state drops to 0 at the next scrape.
    db.backend.retry_dead(&q, None).await.unwrap();
    let line = format!(r#"relayq_queue_jobs{{queue="{q}",state="dead"}} 0"#);
    let text = get_until(&app, "/metrics", |a| a.body.lines().any(|l| l == line))
        .await
        .body;
    assert!(text.lines().any(|l| l == line), "{text}");

    // Without a handle there is no /metrics.
    let plain = router(db.backend.clone(), Options::default());
    assert_eq!(get(&plain, "/metrics").await.status, 404);
}

/// The value of the sample `series` (name and labels) in the Prometheus `text`.
fn value(text: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("missing {series:?} in\n{text}"))
        .parse()
        .unwrap()
}
