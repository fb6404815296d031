//! Promotion: what finishing (or adding) a job releases. Runs inside the caller's write
//! transaction, so the invariants below hold at every commit:
//!
//! - per (queue, group), at most one job is `ready`, `running` or `retrying`: the
//!   group's holder; the others are `blocked` (SPEC G1);
//! - the holder, when not yet started, is the group's earliest job (order key) whose
//!   stage is released (SPEC G2, G4);
//! - a batch job is `ready`, `running` or `retrying` only if no unfinished job of its
//!   batch has a lower stage (SPEC B2).
//!
//! Every look-up names its index (`INDEXED BY`) and repeats the partial index's
//! `state IN (...)` term: SQLite uses a partial index only when the query's WHERE
//! contains its condition, and otherwise picked `relayq_jobs_batch` or
//! `relayq_jobs_state`, which scan every job of the batch, finished ones included, or
//! every ready job of the queue, once per settled job.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use relayq_core::{JobState, Result};

use crate::{Conn, db, us};

/// Where a job that just finished sat.
pub(crate) struct Finished<'a> {
    pub(crate) queue: &'a str,
    pub(crate) group: Option<&'a str>,
    pub(crate) batch: Option<i64>,
    pub(crate) stage: Option<i64>,
    pub(crate) state: JobState,
}

/// Applies what follows from one finished job; see [`Touched`].
pub(crate) async fn on_finish(c: &mut Conn, job: &Finished<'_>, now: DateTime<Utc>) -> Result<()> {
    let mut touched = Touched::default();
    touched.finished(c, job, now).await?;
    touched.promote(c).await
}

/// The batches and groups a write transaction finished jobs of, promoted once at its
/// end: a settle of 50 jobs of one stage releases the next stage once, not 50 times.
/// Promotion reads only the current rows, so once at the end leaves the same state as
/// once per job.
#[derive(Default)]
pub(crate) struct Touched {
    /// Batch → the lowest stage of a job it finished.
    batches: BTreeMap<i64, i64>,
    groups: BTreeSet<(String, String)>,
}

impl Touched {
    /// Records a finished job. A dead one halts its `Halt` batch at once, which fails
    /// the batch and cancels every job of a later stage (SPEC B6).
    pub(crate) async fn finished(
        &mut self,
        c: &mut Conn,
        job: &Finished<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if let (Some(batch), Some(stage)) = (job.batch, job.stage) {
            if job.state == JobState::Dead {
                halt(c, batch, stage, now).await?;
            }
            let low = self.batches.entry(batch).or_insert(stage);
            *low = (*low).min(stage);
        }
        if let Some(group) = job.group {
            self.group(job.queue, group);
        }
        Ok(())
    }

    /// Records a group whose holder may have changed (a job of it finished or was
    /// released).
    pub(crate) fn group(&mut self, queue: &str, group: &str) {
        self.groups.insert((queue.to_owned(), group.to_owned()));
    }

    /// Releases each batch's next stage (SPEC B2), then gives each group its holder
    /// (SPEC G2). A batch with an unfinished job at a stage no higher than the lowest
    /// one finished keeps its floor, so there is nothing to release: one probe of the
    /// stage index instead of the promotion's reads of the whole floor stage on every
    /// settle (the bench's one-stage batch of 20,000 jobs drained 45% faster).
    pub(crate) async fn promote(self, c: &mut Conn) -> Result<()> {
        for (batch, low) in self.batches {
            let below: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM relayq_jobs INDEXED BY relayq_jobs_stage
                 WHERE batch_id = ?1 AND stage <= ?2
                   AND state IN ('ready', 'blocked', 'running', 'retrying') LIMIT 1",
            )
            .bind(batch)
            .bind(low)
            .fetch_optional(&mut *c)
            .await
            .map_err(db)?;
            if below.is_none() {
                release_stage(c, batch).await?;
            }
        }
        for (queue, group) in self.groups {
            settle_group(c, &queue, &group).await?;
        }
        Ok(())
    }
}

/// SPEC B6: in a `Halt` batch, a dead job fails the batch and cancels every job of a
/// later stage (none of which can have started).
async fn halt(c: &mut Conn, batch: i64, stage: i64, now: DateTime<Utc>) -> Result<()> {
    let halted =
        sqlx::query("UPDATE relayq_batches SET failed = 1 WHERE id = ?1 AND on_failure = 'halt'")
            .bind(batch)
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
    if halted > 0 {
        sqlx::query(
            "UPDATE relayq_jobs SET state = 'cancelled', finished_at = ?3
             WHERE batch_id = ?1 AND stage > ?2 AND state IN ('ready', 'blocked')",
        )
        .bind(batch)
        .bind(stage)
        .bind(us(now))
        .execute(&mut *c)
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// Releases the batch's lowest unfinished stage: raises the high-water mark, makes its
/// ungrouped jobs ready and lets each of its groups pick a holder.
///
/// Nothing more when the floor is the released stage already: no ungrouped job there is
/// blocked (the release freed them, and jobs joining it are stored ready), and its
/// grouped jobs are their groups' business. Reading the stage anyway made each enqueue
/// into a released stage cost as much as the stage held.
pub(crate) async fn release_stage(c: &mut Conn, batch: i64) -> Result<()> {
    let floor: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(stage) FROM relayq_jobs
         WHERE batch_id = ?1 AND state IN ('ready', 'blocked', 'running', 'retrying')",
    )
    .bind(batch)
    .fetch_one(&mut *c)
    .await
    .map_err(db)?;
    let Some(floor) = floor else { return Ok(()) };
    let raised = sqlx::query(
        "UPDATE relayq_batches SET released_stage = ?2
         WHERE id = ?1 AND (released_stage IS NULL OR released_stage < ?2)",
    )
    .bind(batch)
    .bind(floor)
    .execute(&mut *c)
    .await
    .map_err(db)?
    .rows_affected();
    if raised == 0 {
        return Ok(());
    }
    sqlx::query(
        "UPDATE relayq_jobs INDEXED BY relayq_jobs_stage SET state = 'ready'
         WHERE batch_id = ?1 AND stage = ?2 AND state = 'blocked' AND group_key IS NULL
           AND state IN ('ready', 'blocked', 'running', 'retrying')",
    )
    .bind(batch)
    .bind(floor)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let groups: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT queue, group_key FROM relayq_jobs INDEXED BY relayq_jobs_stage
         WHERE batch_id = ?1 AND stage = ?2 AND state = 'blocked' AND group_key IS NOT NULL
           AND state IN ('ready', 'blocked', 'running', 'retrying')",
    )
    .bind(batch)
    .bind(floor)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    for (queue, group) in groups {
        settle_group(c, &queue, &group).await?;
    }
    Ok(())
}

/// Makes the group's holder right: if no job of the group is running or retrying, its
/// earliest stage-released job is the one `ready` job and every other is `blocked`.
///
/// Whether a job runs, and which are ready, is read from the holder index (a group's
/// live jobs; each statement repeats its condition, so that SQLite can use it); only
/// the head is looked for in the group index, read in order.
pub(crate) async fn settle_group(c: &mut Conn, queue: &str, group: &str) -> Result<()> {
    let busy: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_holder
         WHERE queue = ?1 AND group_key = ?2 AND state IN ('running', 'retrying')
           AND group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying') LIMIT 1",
    )
    .bind(queue)
    .bind(group)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    if busy.is_some() {
        return Ok(());
    }
    let head: Option<i64> = sqlx::query_scalar(
        "SELECT j.id FROM relayq_jobs j INDEXED BY relayq_jobs_group
         WHERE j.queue = ?1 AND j.group_key = ?2 AND j.state IN ('ready', 'blocked')
           AND j.state IN ('ready', 'blocked', 'running', 'retrying')
           AND (j.batch_id IS NULL OR j.stage <= (
                SELECT MIN(s.stage) FROM relayq_jobs s
                WHERE s.batch_id = j.batch_id
                  AND s.state IN ('ready', 'blocked', 'running', 'retrying')))
         ORDER BY j.priority, j.run_at, j.id LIMIT 1",
    )
    .bind(queue)
    .bind(group)
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    sqlx::query(
        "UPDATE relayq_jobs INDEXED BY relayq_jobs_holder SET state = 'blocked'
         WHERE queue = ?1 AND group_key = ?2 AND state = 'ready' AND id IS NOT ?3
           AND group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying')",
    )
    .bind(queue)
    .bind(group)
    .bind(head)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    if let Some(head) = head {
        sqlx::query("UPDATE relayq_jobs SET state = 'ready' WHERE id = ?1 AND state = 'blocked'")
            .bind(head)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(())
}
