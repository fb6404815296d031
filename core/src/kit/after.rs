//! Dependencies (SPEC D) as backends store them: the checks of a stored job named in
//! `after`, and a call's edges with the ids its jobs got.

use crate::{After, AfterFailure, Enqueued, Error, JobId, JobState, NewJob, Result};

/// SPEC D5: `id`, a stored job a new job of `batch` at `stage` runs after, must be a
/// job of the same batch at the same stage or a lower one. `parent` is its batch and
/// stage as stored, `None` when no job of the queue has that id.
///
/// # Errors
/// [`Error::InvalidInput`] on `after`, naming the job.
pub fn check_stored(
    id: JobId,
    parent: Option<(Option<i64>, Option<i32>)>,
    batch: i64,
    stage: i32,
) -> Result<()> {
    match parent {
        None => Err(Error::invalid(
            "after",
            format!("job {id} is unknown in this queue"),
        )),
        Some((b, _)) if b != Some(batch) => Err(Error::invalid(
            "after",
            format!("job {id} is not in batch {batch}"),
        )),
        Some((_, s)) if s.unwrap_or(0) > stage => Err(Error::invalid(
            "after",
            format!(
                "job {id} is in stage {}, above stage {stage} of the job that runs after it",
                s.unwrap_or(0)
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// A stored parent as a backend reads it before an enqueue: its batch, stage and state.
pub type Stored = (Option<i64>, Option<i32>, JobState);

/// SPEC D5: each stored job `job` runs after, read into `parents`, is a job of its
/// batch at the same stage or a lower one ([`check_stored`]); checked job by job, after
/// the job's batch, so the first bad job of a call names the error on every backend.
///
/// # Errors
/// [`Error::InvalidInput`] on `after`, naming the first bad parent.
pub fn check_job(job: &NewJob, parents: &std::collections::HashMap<JobId, Stored>) -> Result<()> {
    let Some(batch) = job.batch else {
        return Ok(());
    };
    for dep in &job.after {
        if let After::Job(id) = dep {
            let parent = parents.get(id).map(|p| (p.0, p.1));
            check_stored(*id, parent, batch.0, job.stage.unwrap_or(0))?;
        }
    }
    Ok(())
}

/// SPEC D4: the policy `job` follows when a parent fails: its own, else its batch's
/// (from `batches`, by batch id), else the default.
#[must_use]
pub fn policy(
    job: &NewJob,
    batches: &std::collections::HashMap<i64, AfterFailure>,
) -> AfterFailure {
    job.after_failure.unwrap_or_else(|| {
        job.batch
            .and_then(|b| batches.get(&b.0).copied())
            .unwrap_or_default()
    })
}

/// SPEC D5: a backend that does not keep dependencies refuses a batch policy for
/// them other than the default, which it would not apply.
///
/// # Errors
/// [`Error::InvalidInput`] on `after_failure`.
pub fn refuse_policy(batch: &crate::NewBatch) -> Result<()> {
    if batch.after_failure == crate::AfterFailure::default() {
        return Ok(());
    }
    Err(Error::invalid(
        "after_failure",
        "this backend does not keep dependencies yet",
    ))
}

/// The stored ids every job of the call names in `after`, in the order of `jobs`.
pub fn stored_ids(jobs: &[NewJob]) -> Vec<JobId> {
    let mut ids: Vec<JobId> = jobs
        .iter()
        .flat_map(|j| &j.after)
        .filter_map(|a| match a {
            After::Job(id) => Some(*id),
            After::Call(_) => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The call's edges as `(child, parent)` ids, once its jobs have their ids in `out`;
/// `after` holds each job's `after`, in the call's order. A deduplicated job stored
/// nothing, so it has no edges of its own (validation keeps any job of the call from
/// running after one that could be).
pub fn edges<'a>(
    after: impl IntoIterator<Item = &'a [After]>,
    out: &[Enqueued],
) -> Vec<(JobId, JobId)> {
    after
        .into_iter()
        .zip(out)
        .filter(|(_, e)| !e.deduplicated)
        .flat_map(|(after, e)| {
            after.iter().map(move |a| {
                let parent = match a {
                    After::Job(id) => *id,
                    After::Call(p) => out[*p].id,
                };
                (e.id, parent)
            })
        })
        .collect()
}

/// How a new job with dependencies starts (SPEC D2, D4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// It waits for this many unfinished parents (0: none left, it may start once its
    /// stage and group allow).
    Waits(u32),
    /// It is stored cancelled: `parent` ended in `state` and the job keeps the
    /// `Cancel` policy.
    Cancelled {
        /// The failed parent.
        parent: JobId,
        /// How it ended: dead or cancelled.
        state: JobState,
    },
}

/// How each new job of the call that has dependencies starts, by its index in the
/// call: stored parents count while unfinished, and one that failed cancels the job
/// under the `Cancel` policy, as does a parent of the same call that is cancelled so;
/// under `Run` a failed parent counts as done. `stored` gives a stored parent's state
/// (checked to exist before); `policy` a job's policy, its batch's when it names none.
pub fn starts(
    jobs: &[NewJob],
    out: &[Enqueued],
    stored: impl Fn(JobId) -> Option<JobState>,
    policy: impl Fn(&NewJob) -> AfterFailure,
) -> Vec<(usize, Start)> {
    let mut start: Vec<Option<Start>> = vec![None; jobs.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); jobs.len()];
    let mut cancelled = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        if job.after.is_empty() || out[i].deduplicated {
            continue;
        }
        let mut left = 0;
        let mut failed = None;
        for dep in &job.after {
            match *dep {
                After::Call(p) => {
                    children[p].push(i);
                    left += 1;
                }
                After::Job(id) => match stored(id) {
                    Some(JobState::Succeeded) => {}
                    Some(st @ (JobState::Dead | JobState::Cancelled)) => {
                        if policy(job) == AfterFailure::Cancel {
                            failed.get_or_insert((id, st));
                        }
                    }
                    _ => left += 1,
                },
            }
        }
        start[i] = Some(match failed {
            Some((parent, state)) => {
                cancelled.push(i);
                Start::Cancelled { parent, state }
            }
            None => Start::Waits(left),
        });
    }
    // Down the call's own edges: a cancelled job cancels its children that keep the
    // `Cancel` policy, and counts as done for the others.
    while let Some(p) = cancelled.pop() {
        for &i in &children[p] {
            let Some(Start::Waits(left)) = start[i] else {
                continue;
            };
            start[i] = Some(if policy(&jobs[i]) == AfterFailure::Cancel {
                cancelled.push(i);
                Start::Cancelled {
                    parent: out[p].id,
                    state: JobState::Cancelled,
                }
            } else {
                Start::Waits(left - 1)
            });
        }
    }
    start
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i, s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BatchId;

    /// SPEC D2, D4: stored parents count while unfinished; a failed one cancels a
    /// `Cancel` child, and that cancel runs down the call's own edges, while a `Run`
    /// child counts a failed parent as done.
    #[test]
    fn starts_count_unfinished_parents_and_cancel_down_the_call() {
        let b = BatchId(1);
        let j = || NewJob::new("q", vec![]).in_batch(b, 0);
        let jobs = [
            j().after(JobId(1)).after(JobId(2)),
            j().after(JobId(3)),
            j().after_call(1),
            j().after_call(2)
                .after_failure(AfterFailure::Run)
                .after_call(0),
            j().after(JobId(3)).after_failure(AfterFailure::Run),
            j(),
        ];
        let out: Vec<Enqueued> = (0..6)
            .map(|i| Enqueued {
                id: JobId(10 + i),
                deduplicated: false,
            })
            .collect();
        let stored = |id: JobId| match id.0 {
            1 => Some(JobState::Succeeded),
            2 => Some(JobState::Running),
            3 => Some(JobState::Dead),
            _ => None,
        };
        let policy = |job: &NewJob| job.after_failure.unwrap_or_default();
        assert_eq!(
            starts(&jobs, &out, stored, policy),
            vec![
                (0, Start::Waits(1)),
                (
                    1,
                    Start::Cancelled {
                        parent: JobId(3),
                        state: JobState::Dead
                    }
                ),
                (
                    2,
                    Start::Cancelled {
                        parent: JobId(11),
                        state: JobState::Cancelled
                    }
                ),
                (3, Start::Waits(1)),
                (4, Start::Waits(0)),
            ]
        );
    }

    /// SPEC D5: a backend without dependencies refuses a batch policy other than the
    /// default, on `after_failure`; the default passes.
    #[test]
    fn a_policy_is_refused_where_dependencies_are_not_kept() {
        let plain = crate::NewBatch::new("q");
        assert!(refuse_policy(&plain).is_ok());
        let run = crate::NewBatch::new("q").after_failure(AfterFailure::Run);
        let err = refuse_policy(&run).unwrap_err();
        assert_eq!(err.invalid_field(), Some("after_failure"), "{err}");
    }

    /// SPEC D4: a job's own policy wins, else its batch's, else `Cancel`.
    #[test]
    fn a_job_follows_its_own_policy_else_its_batch_s() {
        let b = BatchId(1);
        let batches = std::collections::HashMap::from([(1, AfterFailure::Run)]);
        let job = NewJob::new("q", vec![]).in_batch(b, 0);
        assert_eq!(policy(&job, &batches), AfterFailure::Run);
        let own = job.clone().after_failure(AfterFailure::Cancel);
        assert_eq!(policy(&own, &batches), AfterFailure::Cancel);
        let other = NewJob::new("q", vec![]).in_batch(BatchId(2), 0);
        assert_eq!(policy(&other, &batches), AfterFailure::Cancel);
    }

    #[test]
    fn stored_parents_must_share_the_batch_at_no_higher_stage() {
        let ok = check_stored(JobId(1), Some((Some(3), Some(1))), 3, 1);
        assert!(ok.is_ok());
        for (parent, says) in [
            (None, "unknown"),
            (Some((Some(4), Some(0))), "not in batch 3"),
            (Some((None, None)), "not in batch 3"),
            (Some((Some(3), Some(2))), "above stage 1"),
        ] {
            let err = check_stored(JobId(1), parent, 3, 1).unwrap_err();
            assert_eq!(err.invalid_field(), Some("after"));
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn edges_resolve_the_calls_indexes_and_skip_deduplicated_jobs() {
        let b = BatchId(1);
        let jobs = [
            NewJob::new("q", vec![]).in_batch(b, 0),
            NewJob::new("q", vec![]).in_batch(b, 0).after(JobId(5)),
            NewJob::new("q", vec![])
                .in_batch(b, 0)
                .after_call(0)
                .after_call(1),
            NewJob::new("q", vec![]).in_batch(b, 0).after(JobId(2)),
        ];
        let out = [
            Enqueued {
                id: JobId(10),
                deduplicated: false,
            },
            Enqueued {
                id: JobId(11),
                deduplicated: false,
            },
            Enqueued {
                id: JobId(12),
                deduplicated: false,
            },
            Enqueued {
                id: JobId(2),
                deduplicated: true,
            },
        ];
        assert_eq!(
            edges(jobs.iter().map(|j| j.after.as_slice()), &out),
            vec![
                (JobId(11), JobId(5)),
                (JobId(12), JobId(10)),
                (JobId(12), JobId(11)),
            ]
        );
        assert_eq!(stored_ids(&jobs), vec![JobId(2), JobId(5)]);
    }
}
