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

use crate::{Conn, after, db, us};

/// A job of the batch at or below the lowest stage a transaction finished.
pub(crate) const STAGE_BELOW: &str = "SELECT 1 FROM relayq_jobs INDEXED BY relayq_jobs_stage
    WHERE batch_id = ?1 AND stage <= ?2
      AND state IN ('ready', 'blocked', 'running', 'retrying') LIMIT 1";

/// SPEC B6: a dead job halts its `Halt` batch.
pub(crate) const HALT_BATCH: &str =
    "UPDATE relayq_batches SET failed = 1 WHERE id = ?1 AND on_failure = 'halt'";

/// SPEC B6: the halted batch's jobs of later stages are cancelled.
///
/// Through the stage index, from the dead job's stage up. Without the index's own
/// state list SQLite could not use it and took `relayq_jobs_batch`, every job of the
/// batch, finished ones included: each dead job of a batch of 10,000 read all 10,000
/// (510,670 steps for a settle of 40 with ten dead, tests/statistics.rs), in every
/// statistics state.
pub(crate) const HALT_JOBS: &str =
    "UPDATE relayq_jobs INDEXED BY relayq_jobs_stage SET state = 'cancelled', finished_at = ?3
    WHERE batch_id = ?1 AND stage > ?2 AND state IN ('ready', 'blocked')
      AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// The batch's lowest unfinished stage: `MIN` over the stage index's prefix, one
/// probe. Pinned, as [`REACHED`](crate::barrier) is, against `relayq_jobs_batch`.
pub(crate) const STAGE_FLOOR: &str =
    "SELECT MIN(stage) FROM relayq_jobs INDEXED BY relayq_jobs_stage
    WHERE batch_id = ?1 AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// Raises the batch's high-water mark to the floor.
pub(crate) const RAISE_STAGE: &str = "UPDATE relayq_batches SET released_stage = ?2
    WHERE id = ?1 AND (released_stage IS NULL OR released_stage < ?2)";

/// The released stage's ungrouped jobs become ready.
pub(crate) const RELEASE_UNGROUPED: &str =
    "UPDATE relayq_jobs INDEXED BY relayq_jobs_stage SET state = 'ready'
    WHERE batch_id = ?1 AND stage = ?2 AND state = 'blocked' AND group_key IS NULL
      AND deps_left = 0 AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// The groups with a job in the released stage.
pub(crate) const STAGE_GROUPS: &str =
    "SELECT DISTINCT queue, group_key FROM relayq_jobs INDEXED BY relayq_jobs_stage
    WHERE batch_id = ?1 AND stage = ?2 AND state = 'blocked' AND group_key IS NOT NULL
      AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// Whether a job of the group is running or retrying.
pub(crate) const GROUP_BUSY: &str = "SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_holder
    WHERE queue = ?1 AND group_key = ?2 AND state IN ('running', 'retrying')
      AND group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying') LIMIT 1";

/// The group's earliest job whose stage is released and whose dependencies finished
/// (SPEC G4, D3). The batch's floor (`s`) is pinned to the stage index like
/// [`STAGE_FLOOR`].
pub(crate) const GROUP_HEAD: &str = "SELECT j.id FROM relayq_jobs j INDEXED BY relayq_jobs_group
    WHERE j.queue = ?1 AND j.group_key = ?2 AND j.state IN ('ready', 'blocked')
      AND j.deps_left = 0
      AND j.state IN ('ready', 'blocked', 'running', 'retrying')
      AND (j.batch_id IS NULL OR j.stage <= (
           SELECT MIN(s.stage) FROM relayq_jobs s INDEXED BY relayq_jobs_stage
           WHERE s.batch_id = j.batch_id
             AND s.state IN ('ready', 'blocked', 'running', 'retrying')))
    ORDER BY j.priority, j.run_at, j.id LIMIT 1";

/// Every ready job of the group but the head is blocked.
pub(crate) const GROUP_DEMOTE: &str =
    "UPDATE relayq_jobs INDEXED BY relayq_jobs_holder SET state = 'blocked'
    WHERE queue = ?1 AND group_key = ?2 AND state = 'ready' AND id IS NOT ?3
      AND group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying')";

/// The head is ready.
pub(crate) const GROUP_PROMOTE: &str =
    "UPDATE relayq_jobs SET state = 'ready' WHERE id = ?1 AND state = 'blocked'";

/// Where a job that just finished sat.
pub(crate) struct Finished<'a> {
    pub(crate) id: i64,
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
    /// Finished jobs of a batch, for the jobs that run after them (SPEC D).
    parents: after::Parents,
    /// The transaction's time, for what its dependencies cancel.
    now: Option<DateTime<Utc>>,
}

impl Touched {
    /// Records a finished job. A dead one halts its `Halt` batch at once, which fails
    /// the batch and cancels the rest of it (SPEC B6).
    pub(crate) async fn finished(
        &mut self,
        c: &mut Conn,
        job: &Finished<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if let (Some(batch), Some(stage)) = (job.batch, job.stage) {
            if job.state == JobState::Dead {
                self.halt(c, batch, stage, now).await?;
            }
            self.parents.finished(job.id, job.state);
            self.now = Some(now);
        }
        self.cancelled(job.queue, job.group, job.batch, job.stage);
        Ok(())
    }

    /// Records a job of `batch` and `group` that ended without running, or whose
    /// ending is handled already: its stage and its group are looked at again.
    pub(crate) fn cancelled(
        &mut self,
        queue: &str,
        group: Option<&str>,
        batch: Option<i64>,
        stage: Option<i64>,
    ) {
        if let (Some(batch), Some(stage)) = (batch, stage) {
            let low = self.batches.entry(batch).or_insert(stage);
            *low = (*low).min(stage);
        }
        if let Some(group) = group {
            self.group(queue, group);
        }
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
    pub(crate) async fn promote(mut self, c: &mut Conn) -> Result<()> {
        // Dependencies first: what they cancel may finish a stage.
        let mut parents = std::mem::take(&mut self.parents);
        if let Some(now) = self.now {
            parents.settle(c, &mut self, now).await?;
        }
        for (batch, low) in std::mem::take(&mut self.batches) {
            let below: Option<i64> = sqlx::query_scalar(STAGE_BELOW)
                .bind(batch)
                .bind(low)
                .fetch_optional(&mut *c)
                .await
                .map_err(db)?;
            if below.is_none() {
                release_stage(c, batch).await?;
            }
        }
        parents.ready(c).await?;
        for (queue, group) in self.groups {
            settle_group(c, &queue, &group).await?;
        }
        Ok(())
    }
}

impl Touched {
    /// SPEC B6: in a `Halt` batch, a dead job fails the batch and cancels every other
    /// unfinished job: those of later stages (none of which can have started) and those
    /// of its own stage, running ones included, whose attempts are logged as cancelled
    /// and whose groups get their next holder.
    async fn halt(
        &mut self,
        c: &mut Conn,
        batch: i64,
        stage: i64,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let halted = sqlx::query(HALT_BATCH)
            .bind(batch)
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
        if halted == 0 {
            return Ok(());
        }
        sqlx::query(HALT_JOBS)
            .bind(batch)
            .bind(stage)
            .bind(us(now))
            .execute(&mut *c)
            .await
            .map_err(db)?;
        // The dead job's own stage: its running attempts are logged as cancelled, its
        // groups get their next holder, then every unfinished job of it is cancelled.
        sqlx::query(HALT_LOG)
            .bind(batch)
            .bind(stage)
            .bind(us(now))
            .bind(relayq_core::cancelled_by::HALT)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let groups: Vec<(String, String)> = sqlx::query_as(HALT_GROUPS)
            .bind(batch)
            .bind(stage)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        sqlx::query(HALT_STAGE)
            .bind(batch)
            .bind(stage)
            .bind(us(now))
            .execute(&mut *c)
            .await
            .map_err(db)?;
        for (queue, group) in groups {
            self.group(&queue, &group);
        }
        Ok(())
    }
}

/// SPEC B6, L5: the halted stage's running attempts, closed as cancelled; through the
/// stage index, as [`HALT_JOBS`].
pub(crate) const HALT_LOG: &str = "INSERT INTO relayq_attempts
        (job_id, attempt, worker, started_at, ended_at, outcome, error, output, claimed_at)
    SELECT id, attempts, coalesce(worker, ''), coalesce(started_at, 0), ?3, 'cancelled',
        ?4, NULL, started_at
    FROM relayq_jobs INDEXED BY relayq_jobs_stage
    WHERE batch_id = ?1 AND stage = ?2 AND state = 'running'
      AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// SPEC B6, G2: the groups of the halted stage's unfinished jobs.
pub(crate) const HALT_GROUPS: &str = "SELECT DISTINCT queue, group_key
    FROM relayq_jobs INDEXED BY relayq_jobs_stage
    WHERE batch_id = ?1 AND stage = ?2 AND group_key IS NOT NULL
      AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// SPEC B6, B8: the halted stage's unfinished jobs are cancelled, running ones losing
/// their leases.
pub(crate) const HALT_STAGE: &str = "UPDATE relayq_jobs INDEXED BY relayq_jobs_stage
    SET state = 'cancelled', finished_at = ?3, lease_token = NULL, lease_expires_at = NULL
    WHERE batch_id = ?1 AND stage = ?2 AND state IN ('ready', 'blocked', 'running', 'retrying')";

/// Releases the batch's lowest unfinished stage: raises the high-water mark, makes its
/// ungrouped jobs ready and lets each of its groups pick a holder.
///
/// Nothing more when the floor is the released stage already: no ungrouped job there is
/// blocked (the release freed them, and jobs joining it are stored ready), and its
/// grouped jobs are their groups' business. Reading the stage anyway made each enqueue
/// into a released stage cost as much as the stage held.
pub(crate) async fn release_stage(c: &mut Conn, batch: i64) -> Result<()> {
    let floor: Option<i64> = sqlx::query_scalar(STAGE_FLOOR)
        .bind(batch)
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    let Some(floor) = floor else { return Ok(()) };
    let raised = sqlx::query(RAISE_STAGE)
        .bind(batch)
        .bind(floor)
        .execute(&mut *c)
        .await
        .map_err(db)?
        .rows_affected();
    if raised == 0 {
        return Ok(());
    }
    sqlx::query(RELEASE_UNGROUPED)
        .bind(batch)
        .bind(floor)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    let groups: Vec<(String, String)> = sqlx::query_as(STAGE_GROUPS)
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
    let busy: Option<i64> = sqlx::query_scalar(GROUP_BUSY)
        .bind(queue)
        .bind(group)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    if busy.is_some() {
        return Ok(());
    }
    let head: Option<i64> = sqlx::query_scalar(GROUP_HEAD)
        .bind(queue)
        .bind(group)
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    sqlx::query(GROUP_DEMOTE)
        .bind(queue)
        .bind(group)
        .bind(head)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    if let Some(head) = head {
        sqlx::query(GROUP_PROMOTE)
            .bind(head)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(())
}
