//! Two OS processes drain one database file: each job is claimed exactly once (SPEC C2
//! across processes). The test binary runs itself twice as the child drainers.
use std::{collections::HashSet, process::Stdio, time::Duration};

use relayq_core::{Claim, ClaimRequest, CompleteExt, Enqueue, Inspect, JobState, NewJob};
use relayq_sqlite::SqliteBackend;

const CHILD_DB: &str = "RELAYQ_TEST_CHILD_DB";
const CHILD_QUEUE: &str = "RELAYQ_TEST_CHILD_QUEUE";
/// A folder where each child says it is ready, so that both start draining together:
/// otherwise the first could drain every job while the second still starts.
const CHILD_GATE: &str = "RELAYQ_TEST_CHILD_GATE";
const JOBS: usize = 3000;

#[tokio::test]
async fn two_processes_drain_one_file_each_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let queue = format!("p.{}", uuid::Uuid::new_v4().simple());
    let backend = SqliteBackend::open(&url).await.unwrap();
    let jobs = (0..JOBS)
        .map(|i| NewJob::new(&queue, i.to_le_bytes().to_vec()))
        .collect();
    let ids: HashSet<i64> = backend
        .enqueue(jobs)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id.0)
        .collect();

    let children: Vec<_> = (0..2)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_drain",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_DB, &url)
                .env(CHILD_QUEUE, &queue)
                .env(CHILD_GATE, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut per_child = Vec::new();
    for child in children {
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("child finished in time")
            .unwrap();
        assert!(out.status.success(), "child failed: {:?}", out.status);
        let claimed: Vec<i64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("claimed "))
            .map(|id| id.parse().unwrap())
            .collect();
        per_child.push(claimed);
    }

    assert!(
        per_child.iter().all(|c| !c.is_empty()),
        "both processes should claim jobs"
    );
    let mut seen = HashSet::new();
    for id in per_child.iter().flatten() {
        assert!(seen.insert(*id), "job {id} was claimed twice");
    }
    let missing: Vec<_> = ids.difference(&seen).collect();
    let extra: Vec<_> = seen.difference(&ids).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "every job claimed exactly once: {} per child, missing {missing:?}, unknown {extra:?}",
        per_child
            .iter()
            .map(Vec::len)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join("+")
    );
    let stats = backend.queue_stats(&queue).await.unwrap();
    assert_eq!(stats.count(JobState::Succeeded), JOBS as u64, "{stats:?}");
}

/// The child side: claims and completes until the queue has nothing left to claim,
/// printing each claimed id.
#[tokio::test]
#[ignore = "run as a child process by two_processes_drain_one_file_each_job_once"]
async fn child_drain() {
    let (Ok(url), Ok(queue)) = (std::env::var(CHILD_DB), std::env::var(CHILD_QUEUE)) else {
        return;
    };
    let backend = SqliteBackend::open(&url).await.unwrap();
    let worker = format!("child-{}", std::process::id());
    if let Ok(gate) = std::env::var(CHILD_GATE) {
        let gate = std::path::Path::new(&gate);
        std::fs::write(gate.join(format!("ready-{worker}")), b"").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ready = std::fs::read_dir(gate)
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("ready-"))
                .count();
            if ready >= 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the other child never got ready"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // libtest has already printed "test child_drain ... " with no newline.
    let mut lines = String::from("\n");
    loop {
        let req = ClaimRequest::new(&queue, &worker, 5, Duration::from_secs(60));
        let jobs = backend.claim(req).await.unwrap();
        if jobs.is_empty() {
            let stats = backend.queue_stats(&queue).await.unwrap();
            if stats.count(JobState::Ready) == 0 {
                break;
            }
            continue;
        }
        for job in jobs {
            lines.push_str(&format!("claimed {}\n", job.id()));
            backend.complete(&job.lease).await.unwrap();
        }
    }
    use std::io::Write;
    std::io::stdout().write_all(lines.as_bytes()).unwrap();
}
