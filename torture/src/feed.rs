//! Enqueues during faults: half the plan goes in before the workers start, the other
//! half from a producer task while they run and the faults fire, so enqueues, batch
//! fills and seals meet restarts and killed connections like the workers do.
//!
//! Each late chunk goes in exactly once, as an application must do it: a call whose
//! answer was lost (a transient error) may have stored its jobs, and a dedupe key alone
//! cannot tell, since a job gives its key up when it finishes (SPEC E3), and a late
//! chunk's jobs may finish before the call is retried. So every chunk goes into a
//! batch (its own batch, or a one-stage "carrier" batch for grouped and plain jobs),
//! and after a lost answer the producer reads the batch's jobs: the call stored all of
//! them or none (SPEC E1), so it is retried only when none are there.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use relayq::{Backend, Batch, JobId, NewJob, OnFailure, RunAt};
use tokio::sync::watch;

use crate::{plan::Plan, run::queue};

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

/// Job `i` of the plan as enqueued: its command, group, batch and stage, delay, a
/// dedupe key when it has one or when `late`, and the jobs it runs after, each as
/// `parent` names it (a stored id, or a place in the same call). A job of no batch of
/// the plan goes into `carrier` (stage 0) when one is given.
#[must_use]
pub fn new_job(
    plan: &Plan,
    dir: &str,
    batches: &[Batch],
    i: usize,
    late: bool,
    carrier: Option<&Batch>,
    parent: &dyn Fn(usize) -> Option<relayq::After>,
) -> NewJob {
    let job = &plan.jobs[i];
    let payload = serde_json::json!({
        "command": plan.command(dir, i),
        "name": job.key,
        "env": {"LC_ALL": "C"},
    });
    let mut nj = NewJob::new(queue(), payload.to_string().into_bytes())
        .max_attempts(job.max_attempts)
        .enqueued_by("relayq-torture");
    if let Some(g) = &job.group {
        nj = nj.group(g.clone());
    }
    match (job.batch, carrier) {
        (Some((b, s)), _) => nj = nj.in_batch(&batches[b], s),
        (None, Some(c)) => nj = nj.in_batch(c, 0),
        (None, None) => {}
    }
    if job.delay_ms > 0 {
        nj.run_at = RunAt::After(Duration::from_millis(job.delay_ms));
    }
    if job.dedupe || late {
        nj = nj.dedupe_key(job.key.clone());
    }
    if let Some(k) = job.limit_key {
        nj = nj.limit_key(k);
    }
    nj.after = job.after.iter().filter_map(|&p| parent(p)).collect();
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
    /// The early jobs' ids by plan index: the parents of late jobs (SPEC D).
    pub early_ids: Arc<Vec<Option<JobId>>>,
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
            early_ids,
        } = self;
        let parent = |p: usize| early_ids.get(p).copied().flatten().map(relayq::After::Job);
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
            let plan_batch = plan.jobs[chunk[0]].batch.map(|(b, _)| b);
            // Grouped and plain chunks go into a batch of their own (see the module's
            // comment); an open whose answer was lost leaves an empty batch behind.
            let carrier = match plan_batch {
                Some(_) => None,
                None => {
                    let (b, tries) = retry(|| backend.open_batch(queue(), OnFailure::Continue))
                        .await
                        .context("opening a carrier batch")?;
                    out.retried += tries;
                    Some(b)
                }
            };
            let batch = match (plan_batch, &carrier) {
                (Some(b), _) => &batches[b],
                (None, Some(c)) => c,
                (None, None) => unreachable!("a chunk of no batch has a carrier"),
            };
            let jobs = || {
                chunk
                    .iter()
                    .map(|&i| new_job(&plan, &dir, &batches, i, true, carrier.as_ref(), &parent))
                    .collect::<Vec<_>>()
            };
            match enqueue_once(&*backend, &plan, batch, chunk, jobs).await {
                Ok(stored) => {
                    out.retried += stored.tries;
                    out.found_stored += stored.found;
                    out.ids.extend(stored.ids);
                    enqueued += chunk.len() as u64;
                }
                // A batch that refuses the chunk may have taken it on a try whose answer
                // was lost and that ran after the producer looked, and then closed the
                // stage or halted: its job list tells.
                Err(Refused(
                    e @ (relayq::Error::StageClosed { .. }
                    | relayq::Error::InvalidInput { field: "batch", .. }),
                )) if plan_batch.is_some() => {
                    let b = plan_batch.expect("checked");
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
                Err(Refused(e)) => return Err(e).context("enqueue of a late chunk"),
                Err(Unclear(e)) => return Err(e),
            }
            if let Some(c) = &carrier {
                let (_, tries) = retry(|| backend.seal(c)).await.context("seal")?;
                out.retried += tries;
            }
            if let Some(b) = plan_batch
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

/// A chunk stored once: its ids by plan index, the calls made again, and the jobs a
/// call found stored already.
struct Stored {
    ids: Vec<(usize, JobId)>,
    tries: u32,
    found: u32,
}

/// Why [`enqueue_once`] did not store a chunk.
enum NotStored {
    /// The backend's answer to a call.
    Refused(relayq::Error),
    /// The batch holds part of the chunk, or the batch could not be read.
    Unclear(anyhow::Error),
}
use NotStored::{Refused, Unclear};

/// Enqueues `chunk` (the calls `jobs` make) into `batch` once: after a transient error
/// the batch's jobs tell whether that call stored the chunk (all of it or none, SPEC
/// E1), and the call is made again only when none of it is there. For up to 60 s.
async fn enqueue_once(
    backend: &dyn Backend,
    plan: &Plan,
    batch: &Batch,
    chunk: &[usize],
    jobs: impl Fn() -> Vec<NewJob>,
) -> Result<Stored, NotStored> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    loop {
        match backend.enqueue(jobs()).await {
            Ok(got) => {
                let found = got.iter().map(|e| u32::from(e.deduplicated)).sum();
                let ids = chunk
                    .iter()
                    .copied()
                    .zip(got.iter().map(|e| e.id))
                    .collect();
                return Ok(Stored { ids, tries, found });
            }
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (stored, t) = retry(|| stored_in_batch(backend, plan, batch, chunk))
                    .await
                    .context("reading a batch's jobs after a lost answer")
                    .map_err(Unclear)?;
                tries += t;
                if stored.len() == chunk.len() {
                    let found = u32::try_from(stored.len()).unwrap_or(u32::MAX);
                    return Ok(Stored {
                        ids: stored,
                        tries,
                        found,
                    });
                }
                if !stored.is_empty() {
                    return Err(Unclear(anyhow::anyhow!(
                        "a call whose answer was lost stored {} of its {} jobs",
                        stored.len(),
                        chunk.len()
                    )));
                }
            }
            Err(e) => return Err(Refused(e)),
        }
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
            let job = backend.job(queue(), id).await?;
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
    use relayq::{Claim as _, Inspect as _, OrderBarrier as _};

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

    /// Fails its first `lost` calls as a lost answer would, with a transient error:
    /// with `stores`, after storing the jobs and finishing them; without, before.
    struct LosesAnswers {
        inner: relayq::memory::MemoryBackend,
        lost: std::sync::atomic::AtomicU32,
        stores: bool,
    }

    relayq::delegate!(LosesAnswers, inner => Events, Claim, Complete, OrderBarrier, Inspect, Admin, Schedules);

    #[relayq::async_trait]
    impl relayq::Enqueue for LosesAnswers {
        fn limits(&self) -> relayq::Limits {
            relayq::Enqueue::limits(&self.inner)
        }

        async fn enqueue_unchecked(
            &self,
            jobs: Vec<NewJob>,
        ) -> relayq::Result<Vec<relayq::Enqueued>> {
            use std::sync::atomic::Ordering;
            let n = u32::try_from(jobs.len()).unwrap();
            let lost = Err(relayq::Error::transient(std::io::Error::other(
                "connection reset",
            )));
            if self.lost.load(Ordering::SeqCst) == 0 {
                return self.inner.enqueue_unchecked(jobs).await;
            }
            self.lost.fetch_sub(1, Ordering::SeqCst);
            if !self.stores {
                return lost;
            }
            self.inner.enqueue_unchecked(jobs).await?;
            let req = relayq::ClaimRequest::new(queue(), "w", n, Duration::from_secs(60));
            for job in self.inner.claim_unchecked(req).await? {
                relayq::CompleteExt::complete(&self.inner, &job.lease).await?;
            }
            lost
        }
    }

    /// A call whose jobs were stored and had finished before its lost answer is not
    /// made again (a dedupe key would not have caught them: SPEC E3), and a call whose
    /// answer was lost with nothing stored is; each chunk is stored exactly once.
    #[tokio::test]
    async fn a_chunk_is_stored_once_whatever_answers_are_lost() {
        let plan = Plan::generate(7, 300, 1000);
        // Plain jobs a claim takes at once, so the lost call can finish them all.
        let chunk: Vec<usize> = (0..plan.jobs.len())
            .filter(|&i| {
                let j = &plan.jobs[i];
                j.batch.is_none() && j.group.is_none() && j.delay_ms == 0
            })
            .take(5)
            .collect();
        assert_eq!(chunk.len(), 5);
        for stores in [true, false] {
            let backend = LosesAnswers {
                inner: relayq::memory::MemoryBackend::new(),
                lost: 1.into(),
                stores,
            };
            let carrier = backend
                .open_batch(queue(), OnFailure::Continue)
                .await
                .unwrap();
            let jobs = || {
                chunk
                    .iter()
                    .map(|&i| new_job(&plan, "/d", &[], i, true, Some(&carrier), &|_| None))
                    .collect::<Vec<_>>()
            };
            let Ok(stored) = enqueue_once(&backend, &plan, &carrier, &chunk, jobs).await else {
                panic!("not stored (stores: {stores})");
            };
            // Found in the batch after the lost answer, or stored by the second call.
            let found = if stores { 5 } else { 0 };
            assert_eq!((stored.tries, stored.found), (1, found), "stores: {stores}");
            let stats = backend.queue_stats(queue()).await.unwrap();
            assert_eq!(stats.total(), 5, "stores: {stores}: {stats:?}");
            let mut ids: Vec<JobId> = stored.ids.iter().map(|&(_, id)| id).collect();
            ids.sort_unstable();
            assert_eq!(ids, backend.batch_jobs(&carrier, None, 100).await.unwrap());
        }
    }

    /// What the producer reads after a batch refused a chunk: the chunk's jobs the
    /// batch holds, told by their payload's key, and only those.
    #[tokio::test]
    async fn stored_in_batch_finds_the_chunks_jobs_by_key() {
        let plan = Plan::generate(7, 300, 1000);
        let backend = relayq::connect("memory://").await.unwrap();
        let batch = backend
            .open_batch(queue(), relayq::OnFailure::Continue)
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
                    .map(|&i| new_job(&plan, "/d", &batches, i, true, None, &|_| None))
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
