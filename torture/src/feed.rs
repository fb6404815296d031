//! Enqueues during faults: half the plan goes in before the workers start, the other
//! half from a producer task while they run and the faults fire, so enqueues, batch
//! fills and seals meet restarts and killed connections like the workers do.
//!
//! A late job carries its key as dedupe key, so an enqueue retried after an error whose
//! outcome is unknown (the answer lost with its connection) finds the first one
//! instead of storing the job twice: what an application should do (SPEC E3).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use relayq::{Backend, Batch, JobId, NewJob, RunAt};
use tokio::sync::watch;

use crate::{plan::Plan, run::QUEUE};

/// Jobs per enqueue call.
const CHUNK: usize = 100;

/// Which jobs go in before the workers start, and the chunks the producer adds later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Plan indexes enqueued first, in plan order.
    pub early: Vec<usize>,
    /// Later chunks in plan order; a chunk holds the jobs of one batch, or none.
    pub late: Vec<Vec<usize>>,
}

/// The later half of each batch's jobs, of the grouped jobs and of the plain jobs goes
/// late; jobs enqueued twice on purpose (dedupe) or cancelled stay early, as their
/// checks need them stored before the workers start.
#[must_use]
pub fn split(plan: &Plan) -> Split {
    // Each job's stream: its batch, the groups, or the plain jobs.
    let stream = |i: usize| match (&plan.jobs[i].batch, &plan.jobs[i].group) {
        (Some((b, _)), _) => *b,
        (None, Some(_)) => usize::MAX - 1,
        (None, None) => usize::MAX,
    };
    let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
    for i in 0..plan.jobs.len() {
        *sizes.entry(stream(i)).or_default() += 1;
    }
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut early = Vec::new();
    let mut late: Vec<Vec<usize>> = Vec::new();
    for (i, job) in plan.jobs.iter().enumerate() {
        let s = stream(i);
        let nth = seen.entry(s).or_default();
        *nth += 1;
        if job.dedupe || job.cancel || *nth <= sizes[&s] / 2 {
            early.push(i);
            continue;
        }
        match late.last_mut() {
            Some(c) if c.len() < CHUNK && stream(c[0]) == s => c.push(i),
            _ => late.push(vec![i]),
        }
    }
    Split { early, late }
}

/// Job `i` of the plan as enqueued: its command, group, batch and stage, delay, and a
/// dedupe key when it has one or when `late`.
#[must_use]
pub fn new_job(plan: &Plan, dir: &str, batches: &[Batch], i: usize, late: bool) -> NewJob {
    let job = &plan.jobs[i];
    let payload = serde_json::json!({
        "command": plan.command(dir, i),
        "name": job.key,
        "env": {"LC_ALL": "C"},
    });
    let mut nj = NewJob::new(QUEUE, payload.to_string().into_bytes())
        .max_attempts(job.max_attempts)
        .enqueued_by("relayq-torture");
    if let Some(g) = &job.group {
        nj = nj.group(g.clone());
    }
    if let Some((b, s)) = job.batch {
        nj = nj.in_batch(&batches[b], s);
    }
    if job.delay_ms > 0 {
        nj.run_at = RunAt::After(Duration::from_millis(job.delay_ms));
    }
    if job.dedupe || late {
        nj = nj.dedupe_key(job.key.clone());
    }
    nj
}

/// What the producer did.
#[derive(Debug, Clone, Default)]
pub struct Produced {
    /// Ids of the late jobs stored, by plan index.
    pub ids: Vec<(usize, JobId)>,
    /// Late jobs their batch refused because it had halted (SPEC B6: a `Halt` batch
    /// takes no more jobs after a dead one).
    pub refused: Vec<usize>,
    /// Enqueue calls retried after a transient error.
    pub retried: u32,
    /// Late jobs a retried call found already stored (its first try committed).
    pub found_stored: u32,
    /// Batches sealed while the workers ran.
    pub sealed: usize,
}

/// The producer of a run: what it enqueues, where.
pub struct Producer {
    /// The backend.
    pub backend: Arc<dyn Backend>,
    /// The plan.
    pub plan: Arc<Plan>,
    /// The run's folder, for the jobs' commands.
    pub dir: String,
    /// The plan's batches, opened.
    pub batches: Arc<Vec<Batch>>,
    /// The late chunks ([`Split::late`]).
    pub late: Vec<Vec<usize>>,
    /// How many enqueued jobs may be unfinished before the next chunk goes in.
    pub window: u64,
}

impl Producer {
    /// Adds each late chunk once fewer than `window` enqueued jobs are unfinished
    /// (`finished` is the count the run's loop reads; `enqueued` went in before),
    /// seals each batch after its last chunk, and retries calls that fail transiently
    /// for up to 60 s each.
    ///
    /// # Errors
    /// A call that fails for another reason, or for over 60 s.
    pub async fn run(
        self,
        mut finished: watch::Receiver<u64>,
        mut enqueued: u64,
    ) -> anyhow::Result<Produced> {
        let Self {
            backend,
            plan,
            dir,
            batches,
            late,
            window,
        } = self;
        let mut out = Produced::default();
        let last_chunk_of: BTreeMap<usize, usize> = late
            .iter()
            .enumerate()
            .filter_map(|(c, chunk)| plan.jobs[chunk[0]].batch.map(|(b, _)| (b, c)))
            .collect();
        let mut sealed_early = Vec::new();
        for (b, batch) in batches.iter().enumerate() {
            if !last_chunk_of.contains_key(&b) {
                sealed_early.push(batch.clone());
            }
        }
        for batch in &sealed_early {
            let (_, tries) = retry(|| backend.seal(batch)).await.context("seal")?;
            out.retried += tries;
        }
        for (c, chunk) in late.iter().enumerate() {
            finished
                .wait_for(|&f| enqueued.saturating_sub(f) < window)
                .await
                .context("the run ended before the producer")?;
            let jobs = || {
                chunk
                    .iter()
                    .map(|&i| new_job(&plan, &dir, &batches, i, true))
                    .collect::<Vec<_>>()
            };
            let batch = plan.jobs[chunk[0]].batch.map(|(b, _)| b);
            match retry(|| backend.enqueue(jobs())).await {
                Ok((got, tries)) => {
                    out.retried += tries;
                    for (&i, e) in chunk.iter().zip(got) {
                        out.found_stored += u32::from(e.deduplicated);
                        out.ids.push((i, e.id));
                    }
                    enqueued += chunk.len() as u64;
                }
                // A batch that refuses the chunk may have taken it on a try whose answer
                // was lost, and then closed the stage or halted: its job list tells.
                Err(
                    e @ (relayq::Error::StageClosed { .. }
                    | relayq::Error::InvalidInput { field: "batch", .. }),
                ) if batch.is_some() => {
                    let b = batch.expect("checked");
                    let (stored, tries) =
                        retry(|| stored_in_batch(&*backend, &plan, &batches[b], chunk))
                            .await
                            .context("reading a batch's jobs")?;
                    out.retried += tries;
                    let halted = matches!(e, relayq::Error::InvalidInput { .. });
                    if stored.len() == chunk.len() {
                        out.found_stored += u32::try_from(stored.len()).unwrap_or(u32::MAX);
                        out.ids.extend(stored);
                        enqueued += chunk.len() as u64;
                    } else if stored.is_empty() && halted && plan.batches[b].halt {
                        out.refused.extend(chunk);
                    } else {
                        return Err(e).context(format!(
                            "enqueue of a late chunk of batch {b}: refused, and {} of its {} jobs are stored",
                            stored.len(),
                            chunk.len()
                        ));
                    }
                }
                Err(e) => return Err(e).context("enqueue of a late chunk"),
            }
            if let Some(b) = batch
                && last_chunk_of[&b] == c
            {
                let (_, tries) = retry(|| backend.seal(&batches[b])).await.context("seal")?;
                out.retried += tries;
                out.sealed += 1;
            }
        }
        Ok(out)
    }
}

/// The jobs of `chunk` (plan indexes) found in `batch`, by the key in their payload.
async fn stored_in_batch(
    backend: &dyn Backend,
    plan: &Plan,
    batch: &Batch,
    chunk: &[usize],
) -> relayq::Result<Vec<(usize, JobId)>> {
    let wanted: BTreeMap<&str, usize> = chunk
        .iter()
        .map(|&i| (plan.jobs[i].key.as_str(), i))
        .collect();
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let page = backend.batch_jobs(batch, after, 200).await?;
        let Some(&last) = page.last() else {
            return Ok(found);
        };
        for id in page {
            let job = backend.job(QUEUE, id).await?;
            let payload: serde_json::Value =
                serde_json::from_slice(&job.payload).unwrap_or_default();
            if let Some(&i) = payload["name"].as_str().and_then(|k| wanted.get(k)) {
                found.push((i, id));
            }
        }
        after = Some(last);
    }
}

/// Retries `f` on transient errors for up to 60 s (the server may be restarting);
/// returns its value and how many times it was retried.
async fn retry<T, F, Fut>(mut f: F) -> relayq::Result<(T, u32)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = relayq::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok((v, tries)),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_of_each_stream_goes_late_in_chunks_of_one_batch() {
        let plan = Plan::generate(7, 1500, 5000);
        let Split { early, late } = split(&plan);
        let n_late: usize = late.iter().map(Vec::len).sum();
        assert_eq!(early.len() + n_late, plan.jobs.len());
        assert!(n_late * 10 > plan.jobs.len() * 4, "{n_late} late");
        for chunk in &late {
            assert!(chunk.len() <= CHUNK);
            let batch = plan.jobs[chunk[0]].batch.map(|(b, _)| b);
            assert!(
                chunk
                    .iter()
                    .all(|&i| plan.jobs[i].batch.map(|(b, _)| b) == batch)
            );
            assert!(
                chunk
                    .iter()
                    .all(|&i| !plan.jobs[i].dedupe && !plan.jobs[i].cancel)
            );
        }
        // Every batch and every group keeps jobs of both halves.
        for b in 0..plan.batches.len() {
            let of = |i: &usize| plan.jobs[*i].batch.is_some_and(|(x, _)| x == b);
            assert!(early.iter().any(of));
            assert!(late.iter().flatten().any(of));
        }
        // Plan order within each half, so a group's and a stage's order holds.
        let flat: Vec<usize> = late.iter().flatten().copied().collect();
        assert!(flat.windows(2).all(|w| w[0] < w[1]));
        assert!(early.windows(2).all(|w| w[0] < w[1]));
    }

    /// What the producer reads after a batch refused a chunk: the chunk's jobs the
    /// batch holds, told by their payload's key, and only those.
    #[tokio::test]
    async fn stored_in_batch_finds_the_chunks_jobs_by_key() {
        let plan = Plan::generate(7, 300, 1000);
        let backend = relayq::connect("memory://").await.unwrap();
        let batch = backend
            .open_batch(QUEUE, relayq::OnFailure::Continue)
            .await
            .unwrap();
        let batches = vec![batch.clone()];
        let of_batch: Vec<usize> = (0..plan.jobs.len())
            .filter(|&i| plan.jobs[i].batch.is_some_and(|(b, _)| b == 0))
            .collect();
        let (stored, not_stored) = of_batch.split_at(of_batch.len() / 2);
        let got = backend
            .enqueue(
                stored
                    .iter()
                    .map(|&i| new_job(&plan, "/d", &batches, i, true))
                    .collect(),
            )
            .await
            .unwrap();
        // Asked for a chunk of stored and unstored jobs: the stored ones, with ids.
        let chunk: Vec<usize> = stored[..3]
            .iter()
            .chain(&not_stored[..2])
            .copied()
            .collect();
        let found = stored_in_batch(&*backend, &plan, &batch, &chunk)
            .await
            .unwrap();
        let want: Vec<(usize, JobId)> = stored[..3]
            .iter()
            .zip(&got)
            .map(|(&i, e)| (i, e.id))
            .collect();
        assert_eq!(found, want);
        assert!(
            stored_in_batch(&*backend, &plan, &batch, &not_stored[..2])
                .await
                .unwrap()
                .is_empty()
        );
    }
}
