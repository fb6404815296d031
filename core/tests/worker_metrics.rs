//! The worker's counters reach the `metrics` facade: claims, settles by outcome, busy
//! slots, failed backend calls by kind.

mod support;

use std::{sync::Arc, time::Duration};

use metrics_exporter_prometheus::PrometheusBuilder;
use relayq_core::{
    ClaimedJob, Enqueue, Inspect, JobState, NewJob,
    memory::MemoryBackend,
    worker::{JobError, MetricKind, Worker},
};

/// Every series in `text` has a `# HELP` line: none recorded is missing from
/// `worker::METRICS`.
fn every_series_is_described(text: &str) {
    for name in text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
    {
        let help = format!("# HELP {name} ");
        assert!(
            text.lines().any(|l| l.starts_with(&help)),
            "{name} has no help text in\n{text}"
        );
    }
}

/// The value of the sample `name` (with its labels) in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Runs `body` with a recorder of this thread only, on a runtime on this thread (so no
/// other test's worker counts here); what it recorded, as Prometheus text.
fn recorded(body: impl Future<Output = ()>) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    relayq_core::worker::describe_metrics();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body);
    handle.render()
}

#[test]
fn worker_counters_reach_the_installed_recorder() {
    let text = recorded(async {
        let backend = Arc::new(MemoryBackend::new());
        let jobs = ["ok", "ok", "ok", "fail"]
            .map(|p| NewJob::new("m", p.as_bytes().to_vec()).max_attempts(1))
            .to_vec();
        backend.enqueue(jobs).await.unwrap();
        let worker = Worker::builder(backend.clone(), ["m"])
            .name("w1")
            .concurrency(2)
            .handler(|job: ClaimedJob| async move {
                if job.payload == b"fail" {
                    Err(JobError::permanent("no"))
                } else {
                    Ok(())
                }
            })
            .build()
            .unwrap();
        let running = worker.spawn();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stats = backend.queue_stats("m").await.unwrap();
            if stats.count(JobState::Succeeded) + stats.count(JobState::Dead) == 4 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "jobs did not finish: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        running.shutdown().await.unwrap();
    });
    every_series_is_described(&text);
    assert_eq!(
        sample(
            &text,
            r#"relayq_worker_claimed_total{queue="m",worker="w1"}"#
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"relayq_worker_settled_total{queue="m",outcome="succeeded",worker="w1"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"relayq_worker_settled_total{queue="m",outcome="failed",worker="w1"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"relayq_worker_busy_slots{worker="w1"}"#),
        Some(0.0),
        "{text}"
    );
    // How long each handler ran, by outcome.
    assert_eq!(
        sample(
            &text,
            r#"relayq_worker_handler_seconds_count{queue="m",outcome="succeeded",worker="w1"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"relayq_worker_handler_seconds_count{queue="m",outcome="failed",worker="w1"}"#
        ),
        Some(1.0),
        "{text}"
    );
}

/// Heartbeats that fail count as backend errors of the heartbeat call, by kind; the
/// job whose lease then ran out counts as lease lost.
#[test]
fn failed_backend_calls_are_counted_by_call_and_kind() {
    use support::faulty::{Beats, Faulty};
    let q = support::queue();
    let text = recorded(async {
        let memory = Arc::new(MemoryBackend::new());
        let q = q.clone();
        let id = support::enqueue_n(&memory, &q, 1, 3).await[0];
        let worker = Worker::builder(Faulty::new(&memory, Beats::Fail), [q.clone()])
            .name("w2")
            .lease(Duration::from_millis(300))
            .handler(|_job: ClaimedJob| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, JobError>(())
            })
            .build()
            .unwrap()
            .spawn();
        support::until(
            "the job claimed again after its lease ran out",
            async || memory.job(&q, id).await.unwrap().attempts >= 2,
        )
        .await;
        worker.shutdown().await.unwrap();
    });
    let errors = sample(
        &text,
        r#"relayq_worker_backend_errors_total{op="heartbeat",kind="backend",worker="w2"}"#,
    );
    assert!(errors.is_some_and(|n| n >= 1.0), "{text}");
    let lost = sample(
        &text,
        &format!(r#"relayq_worker_lease_lost_total{{queue="{q}",worker="w2"}}"#),
    );
    assert!(lost.is_some_and(|n| n >= 1.0), "{text}");
    every_series_is_described(&text);
}

/// `describe_metrics` gives every worker series its `# HELP` line, once a recorder is
/// installed, and the list it reads names each series the worker records.
#[test]
fn every_worker_series_has_help_text() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    relayq_core::worker::describe_metrics();
    for &(name, kind, _) in relayq_core::worker::METRICS {
        // A series shows in the text once it has a value.
        match kind {
            MetricKind::Counter => metrics::counter!(name).increment(0),
            MetricKind::Gauge => metrics::gauge!(name).set(0.0),
            MetricKind::Histogram => metrics::histogram!(name).record(0.0),
        }
    }
    let text = handle.render();
    for &(name, _, help) in relayq_core::worker::METRICS {
        let line = format!("# HELP {name} {help}");
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}
