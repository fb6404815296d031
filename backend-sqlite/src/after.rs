//! SPEC D: dependencies. What a finished parent does to its children, inside the
//! transaction that finished it, and the edges of an enqueue.
//!
//! Every write to the jobs is an `INSERT ... ON CONFLICT (id) DO UPDATE` over rows read
//! by id, as `claim::CLAIM` explains: a plain `UPDATE ... WHERE id IN (...)` was
//! planned as a scan of the whole table under statistics taken while it was small
//! (351,501 steps for one settle in tests/statistics.rs), and only the conflict check
//! seeks each row by its key whatever the statistics say.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use relayq_core::{
    AfterFailure, Enqueued, Error, JobId, JobState, NewJob, Result, kit::after as kit,
};

use crate::{Conn, db, promote, us};

/// SPEC D4: the children of a parent that ended dead or cancelled, which keep the
/// `Cancel` policy, are cancelled. They never started: a child waits for all its
/// parents.
pub(crate) const CANCEL_CHILDREN: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at
    FROM relayq_job_deps AS d CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = d.child_id
    WHERE d.parent_id = ?1 AND j.state = 'blocked' AND j.after_failure IS NOT 'run'
    ON CONFLICT (id) DO UPDATE SET state = 'cancelled', finished_at = ?2, last_error = ?3
    RETURNING id, queue, group_key, batch_id, stage";

/// SPEC D2: each child of the parents (a JSON array of ids) counts those of its
/// parents off; returns the children left with none, and their groups.
pub(crate) const COUNT_OFF: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at, deps_left)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at,
           c.n
    FROM (SELECT d.child_id AS id, COUNT(*) AS n
          FROM json_each(?1) AS p CROSS JOIN relayq_job_deps AS d ON d.parent_id = p.value
          GROUP BY d.child_id) AS c
    CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = c.id
    WHERE j.state = 'blocked'
    ON CONFLICT (id) DO UPDATE SET deps_left = deps_left - excluded.deps_left
    RETURNING id, queue, group_key, deps_left";

/// SPEC D2: children with no parent left, without a group, whose stage is released,
/// are ready (a grouped one waits for its group's turn: `promote::settle_group`).
pub(crate) const READY: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at
    FROM json_each(?1) AS f CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = f.value
    WHERE j.state = 'blocked' AND j.deps_left = 0 AND j.group_key IS NULL
      AND j.stage <= (SELECT released_stage FROM relayq_batches b WHERE b.id = j.batch_id)
    ON CONFLICT (id) DO UPDATE SET state = 'ready'";

/// A child as [`CANCEL_CHILDREN`] returns it: id, queue, group, batch and stage.
type Child = (i64, String, Option<String>, Option<i64>, Option<i64>);

/// Parents of the batch finished in one transaction, and what follows for their
/// children: cancelled down the graph, or counted off.
#[derive(Default)]
pub(crate) struct Parents {
    /// Finished jobs of a batch, with how they ended.
    finished: Vec<(i64, JobState)>,
    /// Children left with no parent to wait for, by id.
    free: Vec<i64>,
}

impl Parents {
    pub(crate) fn finished(&mut self, id: i64, state: JobState) {
        self.finished.push((id, state));
    }

    /// Cancels the children of failed parents, and theirs; then counts every parent
    /// off its remaining children. Each job it cancels goes to `touched` as finished,
    /// for its batch's stages and its group; a child left with no parent and a group
    /// goes there too.
    pub(crate) async fn settle(
        &mut self,
        c: &mut Conn,
        touched: &mut promote::Touched,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut done = Vec::new();
        while let Some((id, state)) = self.finished.pop() {
            done.push(id);
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                continue;
            }
            let why = relayq_core::cancelled_by::after(JobId(id), state);
            let cancelled: Vec<Child> = sqlx::query_as(CANCEL_CHILDREN)
                .bind(id)
                .bind(us(now))
                .bind(why)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            for (child, queue, group, batch, stage) in cancelled {
                self.finished.push((child, JobState::Cancelled));
                touched.cancelled(&queue, group.as_deref(), batch, stage);
            }
        }
        if done.is_empty() {
            return Ok(());
        }
        let ids = serde_json::to_string(&done).map_err(Error::backend)?;
        let counted: Vec<(i64, String, Option<String>, i64)> = sqlx::query_as(COUNT_OFF)
            .bind(ids)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        for (child, queue, group, left) in counted {
            if left != 0 {
                continue;
            }
            match group {
                Some(g) => touched.group(&queue, &g),
                None => self.free.push(child),
            }
        }
        Ok(())
    }

    /// Makes the free children ready whose stage is released ([`ready`]).
    pub(crate) async fn ready(self, c: &mut Conn) -> Result<()> {
        ready(c, &self.free).await
    }
}

/// Makes the jobs among `ids` ready that have no parent left, no group, and a
/// released stage: called once the transaction released its stages, so a child of a
/// stage released by this very transaction is among them.
pub(crate) async fn ready(c: &mut Conn, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(READY)
        .bind(serde_json::to_string(ids).map_err(Error::backend)?)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

/// A stored parent: its batch, stage and state.
pub(crate) const PARENTS: &str = "SELECT j.id, j.batch_id, j.stage, j.state
    FROM json_each(?1) AS p CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = p.value
    WHERE j.queue = ?2";

pub(crate) use kit::Stored as Parent;

/// The stored jobs the call's jobs run after, by id, as they are now: read before the
/// call writes anything, and checked job by job with its batch ([`check`]).
pub(crate) async fn parents(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
) -> Result<HashMap<JobId, Parent>> {
    let ids = kit::stored_ids(jobs);
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let json = serde_json::to_string(&ids.iter().map(|i| i.0).collect::<Vec<_>>())
        .map_err(Error::backend)?;
    let rows: Vec<(i64, Option<i64>, Option<i32>, String)> = sqlx::query_as(PARENTS)
        .bind(json)
        .bind(queue)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    rows.into_iter()
        .map(|(id, b, s, st)| Ok((JobId(id), (b, s, st.parse()?))))
        .collect()
}

/// New children's counts of unfinished parents and policies, from `[id, left,
/// policy]` rows.
pub(crate) const SET_WAITS: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at, deps_left,
         after_failure)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at,
           w.value ->> 1, w.value ->> 2
    FROM json_each(?1) AS w CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = w.value ->> 0
    WHERE true
    ON CONFLICT (id) DO UPDATE
    SET deps_left = excluded.deps_left, after_failure = excluded.after_failure";

/// New children of a failed parent, cancelled at once (SPEC D4), from `[id, error]`
/// rows.
pub(crate) const SET_CANCELLED: &str = "INSERT INTO relayq_jobs
        (id, queue, state, payload, priority, run_at, max_attempts, created_at, last_error)
    SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at,
           w.value ->> 1
    FROM json_each(?1) AS w CROSS JOIN relayq_jobs AS j NOT INDEXED ON j.id = w.value ->> 0
    WHERE true
    ON CONFLICT (id) DO UPDATE
    SET state = 'cancelled', finished_at = ?2, last_error = excluded.last_error";

/// Stores the call's edges, and each new child's count of unfinished parents; a
/// child of a parent that already failed follows its policy (SPEC D4). Returns the
/// children left with no parent to wait for.
pub(crate) async fn store(
    c: &mut Conn,
    jobs: &[NewJob],
    out: &[Enqueued],
    stored: &HashMap<JobId, Parent>,
    batch_policy: &HashMap<i64, AfterFailure>,
    touched: &mut promote::Touched,
    now: DateTime<Utc>,
) -> Result<Vec<i64>> {
    let edges = kit::edges(jobs.iter().map(|j| j.after.as_slice()), out);
    if edges.is_empty() {
        return Ok(Vec::new());
    }
    let pairs: Vec<[i64; 2]> = edges.iter().map(|(c, p)| [p.0, c.0]).collect();
    sqlx::query(
        "INSERT INTO relayq_job_deps (parent_id, child_id)
         SELECT p.value ->> 0, p.value ->> 1 FROM json_each(?1) AS p",
    )
    .bind(serde_json::to_string(&pairs).map_err(Error::backend)?)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let policy = |job: &NewJob| kit::policy(job, batch_policy);
    let starts = kit::starts(jobs, out, |id| stored.get(&id).map(|p| p.2), policy);
    let (mut waits, mut cancels, mut free) = (Vec::new(), Vec::new(), Vec::new());
    for (i, start) in starts {
        let (job, id) = (&jobs[i], out[i].id.0);
        match start {
            kit::Start::Waits(left) => {
                let run = policy(job) == AfterFailure::Run;
                waits.push(serde_json::json!([id, left, run.then_some("run")]));
                if left == 0 {
                    match &job.group {
                        Some(g) => touched.group(&job.queue, g),
                        None => free.push(id),
                    }
                }
            }
            kit::Start::Cancelled { parent, state } => {
                let why = relayq_core::cancelled_by::after(parent, state);
                cancels.push(serde_json::json!([id, why]));
                touched.cancelled(
                    &job.queue,
                    job.group.as_deref(),
                    job.batch.map(|b| b.0),
                    job.batch.map(|_| i64::from(job.stage.unwrap_or(0))),
                );
            }
        }
    }
    if !waits.is_empty() {
        sqlx::query(SET_WAITS)
            .bind(serde_json::Value::Array(waits).to_string())
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    if !cancels.is_empty() {
        sqlx::query(SET_CANCELLED)
            .bind(serde_json::Value::Array(cancels).to_string())
            .bind(us(now))
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(free)
}
