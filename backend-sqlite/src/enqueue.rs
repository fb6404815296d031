//! SPEC E: storing jobs in one write transaction.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use relayq_core::{
    AfterFailure, BatchId, Enqueue, Enqueued, Error, EventKind, JobId, Limits, NewJob, Result,
};

use chrono::{DateTime, Utc};

use crate::{Conn, SqliteBackend, after, db, promote, us};

/// The unfinished job of a dedupe key (SPEC E3): one probe of the unique dedupe
/// index, pinned; unpinned, `relayq_jobs_state` (the queue's unfinished jobs) was
/// the alternative the statistics could pick.
pub(crate) const DUPLICATE: &str = "SELECT id FROM relayq_jobs WHERE queue = ?1 AND dedupe_key = ?2
    AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// A batch of the queue: whether it takes jobs, and its released stage.
pub(crate) const OPEN_BATCH_STAGE: &str = "SELECT sealed, failed, released_stage, after_failure
    FROM relayq_batches WHERE id = ?1 AND queue = ?2";

#[async_trait]
impl Enqueue for SqliteBackend {
    fn limits(&self) -> Limits {
        // Limit keys are enforced here (SPEC K), whatever the configuration says.
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
        let (mut tx, now) = self.write().await?;
        let out = enqueue_in(&mut tx, &queue, &jobs, now).await?;
        tx.commit().await.map_err(db)?;
        self.notify(&queue, EventKind::Ready);
        Ok(out)
    }
}

/// Whether the queue has key limits: its keyed jobs may be parked as they arrive.
pub(crate) const KEYED: &str = "SELECT key_limit IS NOT NULL
        OR EXISTS (SELECT 1 FROM relayq_key_limits WHERE queue = ?1)
    FROM relayq_queues WHERE queue = ?1";

/// SPEC K4: parks each new job given as a JSON array of ids that has 64 due, waiting,
/// unparked jobs of its key ahead of it in claim order, for a key whose limit is at
/// most that (written out: SQLite takes no column in a subquery's `LIMIT`; keys with a
/// higher limit are left to the claim's parking). Those jobs each put one parked job
/// of the key back when they leave (a claim and its end, a cancel, a demotion: the
/// `relayq_key_freed` and `relayq_key_passed_on` triggers), so a job parked here
/// always has something to put it back, and claims never read a long backlog of one
/// key. Jobs not yet due are not counted: one of them ahead would hold a due job back.
/// A key with fewer waiting is left to the claim's parking, which a short backlog
/// costs little; parking every job beyond the limit made each of them go back through
/// a settle, and a drain over many keys with a few jobs each ran a fifth slower.
/// The new jobs are found by id (`NOT INDEXED` leaves the planner only the rowid: after
/// an `ANALYZE` it chose to scan the key index instead), so an enqueue reads its own
/// jobs and at most 64 of its key's ahead of each, never the key's whole backlog. The `SELECT` reads the
/// table as it was before the statement, and the first jobs of a key are never
/// parked, so each parked job keeps them ahead. An upsert that finds each row by its
/// id, as `claim::CLAIM` does.
pub(crate) const PARK_NEW: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at
    FROM json_each(?2) AS n
    CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = n.value
    WHERE j.limit_key IS NOT NULL AND j.state IN ('ready', 'retrying') AND j.parked = 0
      AND j.run_at <= ?3
      AND COALESCE((SELECT max FROM relayq_key_limits
                    WHERE queue = ?1 AND limit_key = j.limit_key),
                   (SELECT key_limit FROM relayq_queues WHERE queue = ?1)) <= 64
      AND (SELECT COUNT(*) FROM (
               SELECT 1 FROM relayq_jobs AS a INDEXED BY relayq_jobs_key_waiting
               WHERE a.queue = ?1 AND a.limit_key = j.limit_key
                 AND a.state IN ('ready', 'retrying') AND a.parked = 0 AND a.run_at <= ?3
                 AND (a.priority, a.run_at, a.id) < (j.priority, j.run_at, j.id)
               LIMIT 64)) = 64
    ON CONFLICT (id) DO UPDATE SET parked = 1";

/// SPEC K4: after an enqueue into a queue with key limits, parks the new jobs that
/// have their key's limit of due waiting jobs ahead ([`PARK_NEW`]).
async fn park_new(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    out: &[Enqueued],
    now: DateTime<Utc>,
) -> Result<()> {
    let new = relayq_core::kit::keys::new_keyed_ids(jobs, out);
    if new.is_empty() {
        return Ok(());
    }
    let keyed: Option<bool> = sqlx::query_scalar(KEYED)
        .bind(queue)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    if keyed != Some(true) {
        return Ok(());
    }
    sqlx::query(PARK_NEW)
        .bind(queue)
        .bind(serde_json::to_string(&new).map_err(Error::backend)?)
        .bind(us(now))
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

/// The whole enqueue inside the write transaction on `tx`, which the caller commits.
pub(crate) async fn enqueue_in(
    tx: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    now: DateTime<Utc>,
) -> Result<Vec<Enqueued>> {
    let parents = after::parents(&mut *tx, queue, jobs).await?;
    let (released, policies) = check_batches(&mut *tx, queue, jobs, &parents).await?;
    let (mut groups, mut batches) = (BTreeSet::new(), BTreeSet::new());
    let out = if jobs.iter().all(|j| j.dedupe_key.is_none()) {
        let ids = insert_all(&mut *tx, queue, jobs, &released, now).await?;
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
            if let Some(id) = duplicate(&mut *tx, queue, job).await? {
                out.push(Enqueued {
                    id: JobId(id),
                    deduplicated: true,
                });
                continue;
            }
            let id = insert_one(&mut *tx, queue, job, &released, now).await?;
            note(job, &released, &mut groups, &mut batches);
            out.push(Enqueued {
                id: JobId(id),
                deduplicated: false,
            });
        }
        out
    };
    // SPEC D: the call's edges, before any promotion, which reads each job's count.
    let mut touched = promote::Touched::default();
    let free = after::store(&mut *tx, jobs, &out, &parents, &policies, &mut touched, now).await?;
    for batch in batches {
        promote::release_stage(&mut *tx, batch).await?;
    }
    for group in groups {
        promote::settle_group(&mut *tx, queue, &group).await?;
    }
    touched.promote(&mut *tx).await?;
    after::ready(&mut *tx, &free).await?;
    park_new(&mut *tx, queue, jobs, &out, now).await?;
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

async fn insert_one(
    c: &mut Conn,
    queue: &str,
    job: &NewJob,
    released: &Released,
    now: DateTime<Utc>,
) -> Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO relayq_jobs (queue, state, payload, priority, run_at, max_attempts,
             group_key, batch_id, stage, dedupe_key, enqueued_by, created_at, limit_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) RETURNING id",
    )
    .bind(queue)
    .bind(first_state(job, released))
    .bind(&job.payload)
    .bind(i64::from(job.priority))
    .bind(us(job.run_at.resolve(now)))
    .bind(i64::from(job.max_attempts))
    .bind(job.group.as_deref())
    .bind(job.batch.map(|b| b.0))
    .bind(job.batch.map(|_| i64::from(job.stage.unwrap_or(0))))
    .bind(job.dedupe_key.as_deref())
    .bind(job.enqueued_by.as_deref())
    .bind(us(now))
    .bind(job.limit_key.as_deref())
    .fetch_one(&mut *c)
    .await
    .map_err(db)
}

/// [`insert_one`] for many jobs in one statement: the jobs go as a JSON array
/// (payloads in hex), inserted in the array's order. A statement costs this backend
/// more than its work (see `settle::complete_all`).
pub(crate) const INSERT_ALL: &str =
    "INSERT INTO relayq_jobs (queue, state, payload, priority, run_at,
         max_attempts, group_key, batch_id, stage, enqueued_by, created_at, limit_key)
     SELECT ?1, j.value ->> 0, unhex(j.value ->> 1), j.value ->> 2, j.value ->> 3,
            j.value ->> 4, j.value ->> 5, j.value ->> 6, j.value ->> 7, j.value ->> 8, ?2,
            j.value ->> 9
     FROM json_each(?3) AS j ORDER BY j.key
     RETURNING id";

/// The payload bytes one [`INSERT_ALL`] takes before the next one starts, and the
/// largest payload it takes at all: in hex, a statement's text stays far below
/// SQLite's limit on a value (1e9 bytes), whatever `Limits::max_payload` allows.
const INSERT_ALL_BYTES: usize = 4 << 20;

/// Stores `jobs` (none with a dedupe key) and returns their ids in input order: in
/// statements of [`INSERT_ALL`], and a lone job or a payload larger than
/// [`INSERT_ALL_BYTES`] on its own through [`insert_one`].
async fn insert_all(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    released: &Released,
    now: DateTime<Utc>,
) -> Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(jobs.len());
    let mut rest = jobs;
    while !rest.is_empty() {
        // Jobs up to the byte budget; an oversized first job makes a chunk of one.
        let mut bytes = 0;
        let n = rest
            .iter()
            .take_while(|j| {
                bytes += j.payload.len();
                j.payload.len() <= INSERT_ALL_BYTES && bytes <= INSERT_ALL_BYTES
            })
            .count()
            .max(1);
        let (chunk, after) = rest.split_at(n);
        if let [job] = chunk {
            // Binding one job's values directly beats its JSON by a few per cent.
            ids.push(insert_one(c, queue, job, released, now).await?);
        } else {
            ids.extend(insert_chunk(c, queue, chunk, released, now).await?);
        }
        rest = after;
    }
    Ok(ids)
}

async fn insert_chunk(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
    released: &Released,
    now: DateTime<Utc>,
) -> Result<Vec<i64>> {
    let rows: Vec<_> = jobs
        .iter()
        .map(|job| {
            serde_json::json!([
                first_state(job, released),
                hex(&job.payload),
                job.priority,
                us(job.run_at.resolve(now)),
                job.max_attempts,
                job.group,
                job.batch.map(|b| b.0),
                job.batch.map(|_| job.stage.unwrap_or(0)),
                job.enqueued_by,
                job.limit_key,
            ])
        })
        .collect();
    let mut ids: Vec<i64> = sqlx::query_scalar(INSERT_ALL)
        .bind(queue)
        .bind(us(now))
        .bind(serde_json::Value::Array(rows).to_string())
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    // Ids grow in the order rows are inserted (AUTOINCREMENT), and they were inserted
    // in input order; RETURNING itself promises no order.
    ids.sort_unstable();
    if ids.len() != jobs.len() {
        return Err(Error::backend(
            "an insert of many jobs stored a different count",
        ));
    }
    Ok(ids)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

/// SPEC E4, B3, D5: every batch named exists in this queue, is open, not halted, and no
/// job goes below its released stage, and every stored job it runs after is of its
/// batch at no higher stage. Checked before anything is written, job by job
/// in input order, so the first bad job names the error (as on every backend).
/// Returns each batch's released stage, and its dependency policy (SPEC D4).
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

#[cfg(test)]
mod tests {
    use super::*;
    use relayq_core::{Inspect, Limits};
    use sqlx::sqlite::SqliteConnectOptions;

    /// One call's jobs keep their order and their exact payloads across the statements
    /// [`insert_all`] splits them into: several [`INSERT_ALL`]s, and a payload too large
    /// for one stored alone in the middle.
    #[tokio::test]
    async fn many_jobs_keep_order_and_payloads_across_statements() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("enqueue.db"))
            .create_if_missing(true);
        let limits = Limits {
            max_payload: 2 * INSERT_ALL_BYTES,
            ..Limits::default()
        };
        let backend = SqliteBackend::open_with(options, limits).await.unwrap();
        let every_byte: Vec<u8> = (0..=255).collect();
        let mut payloads = vec![Vec::new(), every_byte];
        // Five of a quarter of the statement's bytes: the fifth starts a second one.
        payloads.extend((0..5u8).map(|i| vec![i; INSERT_ALL_BYTES / 4]));
        payloads.push(vec![7; INSERT_ALL_BYTES + 1]);
        payloads.push(b"last".to_vec());
        let jobs = payloads
            .iter()
            .map(|p| NewJob::new("q", p.clone()))
            .collect();
        let ids: Vec<i64> = backend
            .enqueue(jobs)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id.0)
            .collect();
        assert!(ids.is_sorted(), "ids out of input order: {ids:?}");
        for (id, payload) in ids.iter().zip(&payloads) {
            let info = backend.job("q", JobId(*id)).await.unwrap();
            assert!(
                info.payload == *payload,
                "job {id}: {} bytes back for {}",
                info.payload.len(),
                payload.len()
            );
        }
    }
}
