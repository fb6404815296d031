//! Scenario 5: 100 groups x 100 no-op jobs, 16 worker slots: jobs/s, and a check that
//! no two jobs of one group ever ran at once (the run fails if they did).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Instant,
};

use relayq::{
    Backend, ClaimedJob, NewJob,
    worker::{JobError, Worker},
};
use tokio::sync::Notify;

use crate::{
    Row,
    peers::Peers,
    scenarios::{queue, rate},
    targets::Target,
};

const GROUPS: usize = 100;

pub async fn groups(
    targets: &[Target],
    peers: &Peers,
    per_group: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let name = match prefetch {
        0 => format!("groups {GROUPS}x{per_group}, concurrency 16"),
        p => format!("groups {GROUPS}x{per_group}, concurrency 16, prefetch {p}"),
    };
    // Peers run only the row without prefetch: their settings fetch ahead already.
    let peer = (prefetch == 0).then_some((peers, "groups", GROUPS * per_group, 16));
    crate::scenarios::each(targets, runs, &name, peer, false, |b, scale| async move {
        once(b, (per_group / scale).max(2), prefetch).await
    })
    .await
}

async fn once(b: Arc<dyn Backend>, per_group: usize, prefetch: u32) -> anyhow::Result<f64> {
    let q = queue("groups");
    // Interleaved, so every claim sees many groups' heads.
    let jobs: Vec<NewJob> = (0..per_group)
        .flat_map(|_| (0..GROUPS).map(|g| format!("g{g}")))
        .map(|g| NewJob::new(&q, b"x".to_vec()).group(g))
        .collect();
    for chunk in jobs.chunks(1000) {
        b.enqueue(chunk.to_vec()).await?;
    }
    let n = jobs.len();
    let running = Arc::new(Mutex::new(HashSet::new()));
    let overlaps = Arc::new(Mutex::new(0usize));
    let done = Arc::new(Mutex::new(0usize));
    let all_done = Arc::new(Notify::new());
    let (r, o, d, a) = (
        running.clone(),
        overlaps.clone(),
        done.clone(),
        all_done.clone(),
    );
    let start = Instant::now();
    let worker = Worker::builder(b.clone(), [q.clone()])
        .concurrency(16)
        .prefetch(prefetch)
        .handler(move |job: ClaimedJob| {
            let (r, o, d, a) = (r.clone(), o.clone(), d.clone(), a.clone());
            async move {
                let g = job.group.clone().unwrap_or_default();
                if !r.lock().expect("running").insert(g.clone()) {
                    *o.lock().expect("overlaps") += 1;
                }
                tokio::task::yield_now().await;
                r.lock().expect("running").remove(&g);
                let mut d = d.lock().expect("done");
                *d += 1;
                if *d == n {
                    a.notify_one();
                }
                Ok::<_, JobError>(())
            }
        })
        .build()?
        .spawn();
    all_done.notified().await;
    worker.shutdown().await?;
    let r = rate(n, start.elapsed());
    crate::scenarios::clean(&*b, &q).await?;
    let overlaps = *overlaps.lock().expect("overlaps");
    anyhow::ensure!(
        overlaps == 0,
        "{overlaps} jobs ran while their group was running"
    );
    Ok(r)
}
