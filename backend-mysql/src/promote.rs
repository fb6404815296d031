//! Promotion: what finishing (or adding) a job releases. Runs inside the caller's
//! transaction, which holds its queue's lock exclusively (`lock.rs`), so no claim or
//! other write of the queue runs beside it and these hold at every commit:
//!
//! - per (queue, group), at most one job is `ready`, `running` or `retrying`: the
//!   group's holder; the others are `blocked` (SPEC G1);
//! - the holder, when not yet started, is the group's earliest job (order key) whose
//!   stage is released (SPEC G2, G4);
//! - a batch job is `ready`, `running` or `retrying` only if no unfinished job of its
//!   batch has a lower stage (SPEC B2).
//!
//! Each look-up reads an index over a generated column that holds only the rows it is
//! for (`schema.rs`): `live_batch` for a batch's unfinished jobs by stage,
//! `holding_group` for a group's holder, `live_group` for its unfinished jobs in order.

use std::collections::{BTreeMap, BTreeSet};

use relayq_core::{JobState, Result};

use crate::{Conn, after, by_id, db};

/// A job of the batch at or below the lowest stage a transaction finished.
const STAGE_BELOW: &str = "SELECT 1 FROM relayq_jobs
    WHERE live_batch = ? AND stage <= ? LIMIT 1";

/// SPEC B6: a dead job halts its `Halt` batch.
const HALT_BATCH: &str =
    "UPDATE relayq_batches SET failed = TRUE WHERE id = ? AND on_failure = 'halt' AND NOT failed";

/// SPEC B6: the halted batch's jobs of later stages, to be cancelled.
const HALT_JOBS: &str = "SELECT id FROM relayq_jobs
    WHERE live_batch = ? AND stage > ? AND state IN ('ready', 'blocked')";

/// SPEC B6, L5: the halted stage's running attempts, closed as cancelled.
const HALT_LOG: &str = "INSERT INTO relayq_attempts
        (job_id, attempt, worker, started_at, ended_at, outcome, error, output, claimed_at)
    SELECT id, attempts, COALESCE(worker, ''), COALESCE(started_at, 0), ?, 'cancelled', ?,
        NULL, started_at
    FROM relayq_jobs WHERE live_batch = ? AND stage = ? AND state = 'running'";

/// SPEC B6, G2: the groups of the halted stage's unfinished jobs.
const HALT_GROUPS: &str = "SELECT DISTINCT CAST(queue AS CHAR), CAST(group_key AS CHAR)
    FROM relayq_jobs WHERE live_batch = ? AND stage = ? AND group_key IS NOT NULL";

/// SPEC B6, B8: the halted stage's unfinished jobs, to be cancelled, running ones
/// losing their leases.
const HALT_STAGE: &str = "SELECT id FROM relayq_jobs WHERE live_batch = ? AND stage = ?";

/// The batch's lowest unfinished stage: one probe of the stage index.
const STAGE_FLOOR: &str = "SELECT MIN(stage) FROM relayq_jobs WHERE live_batch = ?";

/// Raises the batch's high-water mark to the floor.
const RAISE_STAGE: &str = "UPDATE relayq_batches SET released_stage = ?
    WHERE id = ? AND (released_stage IS NULL OR released_stage < ?)";

/// The released stage's ungrouped jobs with no parent left, to become ready (SPEC D3).
const RELEASE_UNGROUPED: &str = "SELECT id FROM relayq_jobs
    WHERE live_batch = ? AND stage = ? AND state = 'blocked' AND group_key IS NULL
      AND deps_left = 0";

/// The groups with a job in the released stage.
const STAGE_GROUPS: &str = "SELECT DISTINCT CAST(queue AS CHAR), CAST(group_key AS CHAR)
    FROM relayq_jobs
    WHERE live_batch = ? AND stage = ? AND state = 'blocked' AND group_key IS NOT NULL";

/// Whether a job of the group is running or retrying.
const GROUP_BUSY: &str = "SELECT id FROM relayq_jobs
    WHERE queue = ? AND holding_group = ? AND state IN ('running', 'retrying') LIMIT 1";

/// The group's earliest job whose stage is released and whose parents finished (SPEC
/// G4, D3): the group index in order, each batch job checked against its batch's floor.
const GROUP_HEAD: &str = "SELECT j.id FROM relayq_jobs j
    WHERE j.queue = ? AND j.live_group = ? AND j.state IN ('ready', 'blocked')
      AND j.deps_left = 0
      AND (j.batch_id IS NULL OR j.stage <= (
           SELECT MIN(s.stage) FROM relayq_jobs s WHERE s.live_batch = j.batch_id))
    ORDER BY j.priority, j.run_at, j.id LIMIT 1";

/// Every ready job of the group but the head, to be blocked.
const GROUP_DEMOTE: &str = "SELECT id FROM relayq_jobs
    WHERE queue = ? AND holding_group = ? AND state = 'ready' AND NOT (id <=> ?)";

/// The keys of the unparked ready jobs [`GROUP_DEMOTE`] is about to block: each may be
/// the one a freed slot put back, and passes its turn on (SPEC K4).
const DEMOTED_KEYS: &str = "SELECT CAST(limit_key AS CHAR) FROM relayq_jobs
    WHERE queue = ? AND holding_group = ? AND state = 'ready' AND NOT (id <=> ?)
      AND limit_key IS NOT NULL AND NOT parked";

/// The keys of the halted stage's running and unparked waiting jobs, whose slots the
/// halt frees (SPEC K2, K4).
const HALT_KEYS: &str = "SELECT CAST(queue AS CHAR), CAST(limit_key AS CHAR) FROM relayq_jobs
    WHERE live_batch = ? AND stage = ? AND limit_key IS NOT NULL
      AND (state = 'running' OR (state IN ('ready', 'retrying') AND NOT parked))";

/// The head is ready.
const GROUP_PROMOTE: &str = "UPDATE relayq_jobs SET state = 'ready'
    WHERE id = ? AND state = 'blocked'";

/// Where a job that just finished sat.
pub(crate) struct Finished<'a> {
    pub(crate) id: i64,
    pub(crate) queue: &'a str,
    pub(crate) group: Option<&'a str>,
    pub(crate) batch: Option<i64>,
    pub(crate) stage: Option<i64>,
    pub(crate) state: JobState,
}

/// The batches and groups a transaction finished jobs of, promoted once at its end: a
/// settle of 50 jobs of one stage releases the next stage once, not 50 times.
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
    now: Option<i64>,
}

impl Touched {
    /// Records a finished job. A dead one halts its `Halt` batch at once, which fails
    /// the batch and cancels the rest of it (SPEC B6).
    pub(crate) async fn finished(
        &mut self,
        c: &mut Conn,
        job: &Finished<'_>,
        now: i64,
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

    /// Records a group whose holder may have changed.
    pub(crate) fn group(&mut self, queue: &str, group: &str) {
        self.groups.insert((queue.to_owned(), group.to_owned()));
    }

    /// Releases each batch's next stage (SPEC B2), then gives each group its holder
    /// (SPEC G2). A batch with an unfinished job at a stage no higher than the lowest
    /// one finished keeps its floor: one probe instead of the release's reads.
    pub(crate) async fn promote(mut self, c: &mut Conn) -> Result<()> {
        // Dependencies first: what they cancel may finish a stage.
        let mut parents = std::mem::take(&mut self.parents);
        if let Some(now) = self.now {
            parents.settle(c, &mut self, now).await?;
        }
        for (batch, low) in std::mem::take(&mut self.batches) {
            let below: Option<i32> = sqlx::query_scalar(STAGE_BELOW)
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

    /// SPEC B6: in a `Halt` batch, a dead job fails the batch and cancels every other
    /// unfinished job: those of later stages (none of which can have started) and those
    /// of its own stage, running ones included, whose attempts are logged as cancelled
    /// and whose groups get their next holder.
    async fn halt(&mut self, c: &mut Conn, batch: i64, stage: i64, now: i64) -> Result<()> {
        let halted = sqlx::query(HALT_BATCH)
            .bind(batch)
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
        if halted == 0 {
            return Ok(());
        }
        let later: Vec<i64> = sqlx::query_scalar(HALT_JOBS)
            .bind(batch)
            .bind(stage)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        by_id::update(c, &later, |q| {
            q.push("UPDATE relayq_jobs SET state = 'cancelled', finished_at = ")
                .push_bind(now);
        })
        .await?;
        sqlx::query(HALT_LOG)
            .bind(now)
            .bind(relayq_core::cancelled_by::HALT)
            .bind(batch)
            .bind(stage)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let groups: Vec<(String, String)> = sqlx::query_as(HALT_GROUPS)
            .bind(batch)
            .bind(stage)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let keys: Vec<(String, String)> = sqlx::query_as(HALT_KEYS)
            .bind(batch)
            .bind(stage)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let halted: Vec<i64> = sqlx::query_scalar(HALT_STAGE)
            .bind(batch)
            .bind(stage)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        by_id::update(c, &halted, |q| {
            q.push(
                "UPDATE relayq_jobs SET lease_token = NULL, lease_expires_at = NULL,
                     state = 'cancelled', finished_at = ",
            )
            .push_bind(now);
        })
        .await?;
        for (queue, key) in keys {
            crate::keys::freed(c, &queue, Some(&key)).await?;
        }
        for (queue, group) in groups {
            self.group(&queue, &group);
        }
        Ok(())
    }
}

/// Releases the batch's lowest unfinished stage: raises the high-water mark, makes its
/// ungrouped jobs ready and lets each of its groups pick a holder. Nothing more when
/// the floor is the released stage already.
pub(crate) async fn release_stage(c: &mut Conn, batch: i64) -> Result<()> {
    let floor: Option<i64> = sqlx::query_scalar(STAGE_FLOOR)
        .bind(batch)
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    let Some(floor) = floor else { return Ok(()) };
    let raised = sqlx::query(RAISE_STAGE)
        .bind(floor)
        .bind(batch)
        .bind(floor)
        .execute(&mut *c)
        .await
        .map_err(db)?
        .rows_affected();
    if raised == 0 {
        return Ok(());
    }
    let released: Vec<i64> = sqlx::query_scalar(RELEASE_UNGROUPED)
        .bind(batch)
        .bind(floor)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    by_id::update(c, &released, |q| {
        q.push("UPDATE relayq_jobs SET state = 'ready'");
    })
    .await?;
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
    let keys: Vec<String> = sqlx::query_scalar(DEMOTED_KEYS)
        .bind(queue)
        .bind(group)
        .bind(head)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let demoted: Vec<i64> = sqlx::query_scalar(GROUP_DEMOTE)
        .bind(queue)
        .bind(group)
        .bind(head)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    // Blocked, a job leaves its parking: when it is promoted again its key may have
    // room, and no slot would free to put it back.
    by_id::update(c, &demoted, |q| {
        q.push("UPDATE relayq_jobs SET state = 'blocked', parked = FALSE");
    })
    .await?;
    for key in keys {
        crate::keys::freed(c, queue, Some(&key)).await?;
    }
    if let Some(head) = head {
        sqlx::query(GROUP_PROMOTE)
            .bind(head)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(())
}
