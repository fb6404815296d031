//! SPEC E: storing jobs in one transaction that holds their queue's lock.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use relayq_core::{
    AfterFailure, BatchId, Enqueue, Enqueued, Error, JobId, Limits, NewJob, Result,
    retry::retry_transient,
};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, MysqlBackend, after, db, deadlocked, promote, us};

/// The unfinished job of a dedupe key (SPEC E3): one probe of the unique index.
const DUPLICATE: &str = "SELECT id FROM relayq_jobs WHERE queue = ? AND live_dedupe = ?";

/// A batch of the queue: whether it takes jobs, and its released stage.
const OPEN_BATCH_STAGE: &str = "SELECT sealed, failed, released_stage,
        CAST(after_failure AS CHAR)
    FROM relayq_batches WHERE id = ? AND queue = ?";

/// The payload bytes one multi-row insert takes before the next one starts: far below
/// the server's `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL).
const INSERT_BYTES: usize = 4 << 20;

/// The rows one insert takes at most: 13 values each, and a prepared statement takes
/// at most 65,535 placeholders (error 1390).
const INSERT_ROWS: usize = 4000;

#[async_trait]
impl Enqueue for MysqlBackend {
    fn limits(&self) -> Limits {
        Limits {
            limit_keys: true,
            rates: true,
            dependencies: true,
            ..self.inner.limits
        }
    }

    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let Some(queue) = jobs.first().map(|j| j.queue.clone()) else {
            return Ok(Vec::new());
        };
        retry_transient(
            || async {
                let (mut tx, now) = self.write(&[&queue]).await?;
                let out = enqueue_in(&mut tx, &queue, &jobs, now, self.inner.id_step).await?;
                tx.commit().await.map_err(db)?;
                Ok(out)
            },
            deadlocked,
        )
        .await
    }
}

/// The whole enqueue inside a transaction holding the queue's lock, which the caller
/// commits. `step` is the server's `auto_increment_increment`.
pub(crate) async fn enqueue_in(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    now: i64,
    step: i64,
) -> Result<Vec<Enqueued>> {
    let parents = after::parents(&mut *c, queue, jobs).await?;
    let (released, policies) = check_batches(&mut *c, queue, jobs, &parents).await?;
    let (mut groups, mut batches) = (BTreeSet::new(), BTreeSet::new());
    let out = if jobs.iter().all(|j| j.dedupe_key.is_none()) {
        let ids = insert_all(&mut *c, queue, jobs, &released, now, step).await?;
        for job in jobs {
            note(job, &released, &mut groups, &mut batches);
        }
        ids.into_iter()
            .map(|id| Enqueued {
                id: JobId(id),
                deduplicated: false,
            })
            .collect()
    } else {
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            if let Some(id) = duplicate(&mut *c, queue, job).await? {
                out.push(Enqueued {
                    id: JobId(id),
                    deduplicated: true,
                });
                continue;
            }
            let ids = insert_all(
                &mut *c,
                queue,
                std::slice::from_ref(job),
                &released,
                now,
                step,
            )
            .await?;
            note(job, &released, &mut groups, &mut batches);
            out.extend(ids.into_iter().map(|id| Enqueued {
                id: JobId(id),
                deduplicated: false,
            }));
        }
        out
    };
    // SPEC D: the call's edges, before any promotion, which reads each job's count.
    let mut touched = promote::Touched::default();
    let free = after::store(&mut *c, jobs, &out, &parents, &policies, &mut touched, now).await?;
    for batch in batches {
        promote::release_stage(&mut *c, batch).await?;
    }
    for group in groups {
        promote::settle_group(&mut *c, queue, &group).await?;
    }
    touched.promote(&mut *c).await?;
    after::ready(&mut *c, &free).await?;
    crate::keys::park_new(&mut *c, queue, jobs, &out, now).await?;
    Ok(out)
}

/// The unfinished job of `job`'s dedupe key, if it has one (SPEC E3).
async fn duplicate(c: &mut Conn, queue: &str, job: &NewJob) -> Result<Option<i64>> {
    let Some(key) = &job.dedupe_key else {
        return Ok(None);
    };
    sqlx::query_scalar(DUPLICATE)
        .bind(queue)
        .bind(key)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)
}

/// The state a new job starts in. A job without a group is ready at once when it has
/// no batch or joins its batch's released stage: nothing below that stage is
/// unfinished (SPEC B3 turns lower ones away). Other jobs with a group or a batch
/// start blocked, as do jobs with dependencies (SPEC D2); promotion decides.
fn first_state(job: &NewJob, released: &Released) -> &'static str {
    if job.group.is_none() && job.after.is_empty() && !above_released(job, released) {
        "ready"
    } else {
        "blocked"
    }
}

/// Records what promotion must look at after `job` is stored: its group, and its
/// batch when it is above the released stage (only such a job can move the floor).
fn note(
    job: &NewJob,
    released: &Released,
    groups: &mut BTreeSet<String>,
    batches: &mut BTreeSet<i64>,
) {
    if let Some(g) = &job.group {
        groups.insert(g.clone());
    }
    if let (Some(b), true) = (job.batch, above_released(job, released)) {
        batches.insert(b.0);
    }
}

/// Stores `jobs` and returns their ids in input order, in multi-row inserts of up to
/// [`INSERT_ROWS`] jobs and [`INSERT_BYTES`] of payload (a larger payload goes alone). InnoDB gives the rows of
/// one multi-row `INSERT ... VALUES` consecutive ids (steps of
/// `auto_increment_increment`) from `LAST_INSERT_ID()`, in the order they are written,
/// whatever its `innodb_autoinc_lock_mode`: the row count is known before the insert.
async fn insert_all(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    released: &Released,
    now: i64,
    step: i64,
) -> Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(jobs.len());
    let mut rest = jobs;
    while !rest.is_empty() {
        let mut bytes = 0;
        let n = rest
            .iter()
            .take(INSERT_ROWS)
            .take_while(|j| {
                bytes += j.payload.len();
                bytes <= INSERT_BYTES
            })
            .count()
            .max(1);
        let (chunk, after) = rest.split_at(n);
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO relayq_jobs (queue, state, payload, priority, run_at, max_attempts,
                 group_key, batch_id, stage, dedupe_key, enqueued_by, created_at, limit_key) ",
        );
        q.push_values(chunk, |mut b, job| {
            b.push_bind(queue)
                .push_bind(first_state(job, released))
                .push_bind(&job.payload)
                .push_bind(i64::from(job.priority))
                .push_bind(us(job.run_at.resolve(crate::at(now))))
                .push_bind(i64::from(job.max_attempts))
                .push_bind(job.group.as_deref())
                .push_bind(job.batch.map(|b| b.0))
                .push_bind(job.batch.map(|_| i64::from(job.stage.unwrap_or(0))))
                .push_bind(job.dedupe_key.as_deref())
                .push_bind(job.enqueued_by.as_deref())
                .push_bind(now)
                .push_bind(job.limit_key.as_deref());
        });
        let done = q.build().execute(&mut *c).await.map_err(db)?;
        if done.rows_affected() != chunk.len() as u64 {
            return Err(Error::backend(
                "an insert of many jobs stored a different count",
            ));
        }
        let first = i64::try_from(done.last_insert_id()).map_err(Error::backend)?;
        ids.extend((0..).take(chunk.len()).map(|i: i64| first + i * step));
        rest = after;
    }
    Ok(ids)
}

/// SPEC E4, B3, D5: every batch named exists in this queue, is open, not halted, and
/// no job goes below its released stage, and every stored job it runs after is of its
/// batch at no higher stage. Checked before anything is written, job by job in input
/// order, so the first bad job names the error (as on every backend). Returns each
/// batch's released stage, and its dependency policy (SPEC D4).
async fn check_batches(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    parents: &HashMap<JobId, after::Parent>,
) -> Result<(Released, HashMap<i64, AfterFailure>)> {
    let mut released = Released::new();
    let mut policies = HashMap::new();
    for job in jobs {
        let Some(batch) = job.batch else { continue };
        let high = match released.get(&batch) {
            Some(high) => *high,
            None => {
                let (high, policy) = open_batch_stage(c, queue, batch).await?;
                released.insert(batch, high);
                policies.insert(batch.0, policy);
                high
            }
        };
        let stage = job.stage.unwrap_or(0);
        if let Some(r) = high.filter(|r| i64::from(stage) < *r) {
            return Err(Error::StageClosed {
                stage,
                released: i32::try_from(r).unwrap_or(i32::MAX),
            });
        }
        relayq_core::kit::after::check_job(job, parents)?;
    }
    Ok((released, policies))
}

/// Each batch of an enqueue: its released stage, if any.
type Released = HashMap<BatchId, Option<i64>>;

/// Whether `job` joins its batch above the released stage, or before any is.
fn above_released(job: &NewJob, released: &Released) -> bool {
    job.batch.is_some_and(|b| {
        released
            .get(&b)
            .copied()
            .flatten()
            .is_none_or(|r| i64::from(job.stage.unwrap_or(0)) > r)
    })
}

/// The released stage of `batch`, if it can take jobs, and its dependency policy.
async fn open_batch_stage(
    c: &mut Conn,
    queue: &str,
    batch: BatchId,
) -> Result<(Option<i64>, AfterFailure)> {
    let row: Option<(bool, bool, Option<i64>, String)> = sqlx::query_as(OPEN_BATCH_STAGE)
        .bind(batch.0)
        .bind(queue)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    let (sealed, failed, stage, policy) = row.ok_or_else(|| {
        Error::invalid("batch", format!("batch {batch} is unknown in this queue"))
    })?;
    if sealed {
        return Err(Error::invalid("batch", format!("batch {batch} is sealed")));
    }
    if failed {
        return Err(Error::invalid(
            "batch",
            format!("batch {batch} halted after a dead job"),
        ));
    }
    Ok((stage, policy.parse()?))
}
