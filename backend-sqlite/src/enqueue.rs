//! SPEC E: storing jobs in one write transaction.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use relayq_core::{BatchId, Enqueue, Enqueued, Error, EventKind, JobId, NewJob, Result, validate};

use crate::{Conn, SqliteBackend, db, promote, us};

#[async_trait]
impl Enqueue for SqliteBackend {
    async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        validate::new_jobs(&jobs, &self.inner.limits)?;
        let Some(queue) = jobs.first().map(|j| j.queue.clone()) else {
            return Ok(Vec::new());
        };
        let (mut tx, now) = self.write().await?;
        let released = check_batches(&mut tx, &queue, &jobs).await?;
        let mut out = Vec::with_capacity(jobs.len());
        let (mut groups, mut batches) = (BTreeSet::new(), BTreeSet::new());
        for job in &jobs {
            if let Some(key) = &job.dedupe_key {
                let existing: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM relayq_jobs WHERE queue = ?1 AND dedupe_key = ?2
                     AND state IN ('ready', 'blocked', 'running', 'retrying')",
                )
                .bind(&queue)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
                if let Some(id) = existing {
                    out.push(Enqueued {
                        id: JobId(id),
                        deduplicated: true,
                    });
                    continue;
                }
            }
            // A job without a group is ready at once when it has no batch or joins its
            // batch's released stage: nothing below that stage is unfinished (SPEC B3
            // turns lower ones away). Other jobs with a group or a batch start blocked;
            // promotion below decides.
            let above = above_released(job, &released);
            let free = job.group.is_none() && !above;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO relayq_jobs (queue, state, payload, priority, run_at, max_attempts,
                     group_key, batch_id, stage, dedupe_key, enqueued_by, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) RETURNING id",
            )
            .bind(&queue)
            .bind(if free { "ready" } else { "blocked" })
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
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            if let Some(g) = &job.group {
                groups.insert(g.clone());
            }
            // Only a job above the released stage can move the batch's floor.
            if let (Some(b), true) = (job.batch, above) {
                batches.insert(b.0);
            }
            out.push(Enqueued {
                id: JobId(id),
                deduplicated: false,
            });
        }
        for batch in batches {
            promote::release_stage(&mut tx, batch).await?;
        }
        for group in groups {
            promote::settle_group(&mut tx, &queue, &group).await?;
        }
        tx.commit().await.map_err(db)?;
        self.notify(&queue, EventKind::Ready);
        Ok(out)
    }
}

/// SPEC E4, B3: every batch named exists in this queue, is open, not halted, and no
/// job goes below its released stage. Checked before anything is written, job by job
/// in input order, so the first bad job names the error (as on every backend).
/// Returns each batch's released stage.
async fn check_batches(c: &mut Conn, queue: &str, jobs: &[NewJob]) -> Result<Released> {
    let mut released = Released::new();
    for job in jobs {
        let Some(batch) = job.batch else { continue };
        let high = match released.get(&batch) {
            Some(high) => *high,
            None => {
                let high = open_batch_stage(c, queue, batch).await?;
                released.insert(batch, high);
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
    }
    Ok(released)
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

/// The released stage of `batch`, if it can take jobs.
async fn open_batch_stage(c: &mut Conn, queue: &str, batch: BatchId) -> Result<Option<i64>> {
    let row: Option<(bool, bool, Option<i64>)> = sqlx::query_as(
        "SELECT sealed, failed, released_stage FROM relayq_batches WHERE id = ?1 AND queue = ?2",
    )
    .bind(batch.0)
    .bind(queue)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    let (sealed, failed, stage) = row.ok_or_else(|| {
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
    Ok(stage)
}
