//! SPEC D: dependencies. What a finished parent does to its children, inside the
//! transaction that finished it (which holds the queue's lock, so no settle of another
//! parent of the same child runs beside it), and the edges of an enqueue.
//!
//! A batch is one queue's, so a job's parents and children are all in its queue.

use std::collections::HashMap;

use relayq_core::{
    AfterFailure, Enqueued, Error, JobId, JobState, NewJob, Result, kit::after as kit,
};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, db, promote};

/// The ids one statement names at most: a prepared statement takes 65,535 placeholders.
const CHUNK: usize = 10_000;

/// The blocked children of a failed parent that keep `Cancel` (SPEC D4).
const CANCELLED_CHILDREN: &str = "SELECT j.id, CAST(j.queue AS CHAR), CAST(j.group_key AS CHAR),
        j.batch_id, j.stage
    FROM relayq_job_deps d JOIN relayq_jobs j ON j.id = d.child_id
    WHERE d.parent_id = ? AND j.state = 'blocked' AND NOT (j.after_failure <=> 'run')";

/// A blocked child of a finished parent, and what promotion needs of it.
type Child = (i64, String, Option<String>, Option<i64>, Option<i64>);

/// The finished jobs of a transaction, for their children: counted off, or cancelled
/// down the graph; and the children freed, for [`ready`](Self::ready) once the stages
/// are released.
#[derive(Default)]
pub(crate) struct Parents {
    finished: Vec<(i64, JobState)>,
    free: Vec<i64>,
}

impl Parents {
    /// Records a finished batch job, with the state it ended in.
    pub(crate) fn finished(&mut self, id: i64, state: JobState) {
        self.finished.push((id, state));
    }

    /// Cancels the children of dead or cancelled parents that keep `Cancel`, down the
    /// graph (each cancelled child is a cancelled parent in turn), then counts every
    /// finished parent off its blocked children. A child at 0 with a group is its
    /// group's business (recorded in `touched`); one without is freed.
    pub(crate) async fn settle(
        &mut self,
        c: &mut Conn,
        touched: &mut promote::Touched,
        now: i64,
    ) -> Result<()> {
        let mut done = Vec::new();
        while let Some((id, state)) = self.finished.pop() {
            done.push(id);
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                continue;
            }
            let children: Vec<Child> = sqlx::query_as(CANCELLED_CHILDREN)
                .bind(id)
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            if children.is_empty() {
                continue;
            }
            let why = relayq_core::cancelled_by::after(JobId(id), state);
            let mut q = QueryBuilder::<MySql>::new(
                "UPDATE relayq_jobs SET state = 'cancelled', finished_at = ",
            );
            q.push_bind(now)
                .push(", last_error = ")
                .push_bind(why)
                .push(" WHERE state = 'blocked' AND id IN ");
            push_ids(&mut q, children.iter().map(|ch| ch.0));
            q.build().execute(&mut *c).await.map_err(db)?;
            for (child, queue, group, batch, stage) in children {
                self.finished.push((child, JobState::Cancelled));
                touched.cancelled(&queue, group.as_deref(), batch, stage);
            }
        }
        for chunk in done.chunks(CHUNK) {
            self.count_off(c, chunk, touched).await?;
        }
        Ok(())
    }

    /// Takes each parent of `parents` off its blocked children's counts.
    async fn count_off(
        &mut self,
        c: &mut Conn,
        parents: &[i64],
        touched: &mut promote::Touched,
    ) -> Result<()> {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT d.child_id, COUNT(*) FROM relayq_job_deps d
             JOIN relayq_jobs j ON j.id = d.child_id AND j.state = 'blocked'
             WHERE d.parent_id IN ",
        );
        push_ids(&mut q, parents.iter().copied());
        q.push(" GROUP BY d.child_id");
        let counts: Vec<(i64, i64)> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
        if counts.is_empty() {
            return Ok(());
        }
        for chunk in counts.chunks(CHUNK / 2) {
            let mut q = QueryBuilder::<MySql>::new(
                "UPDATE relayq_jobs SET deps_left = deps_left - CASE id",
            );
            for (child, n) in chunk {
                q.push(" WHEN ")
                    .push_bind(*child)
                    .push(" THEN ")
                    .push_bind(*n);
            }
            q.push(" END WHERE id IN ");
            push_ids(&mut q, chunk.iter().map(|(child, _)| *child));
            q.build().execute(&mut *c).await.map_err(db)?;
            let mut q = QueryBuilder::<MySql>::new(
                "SELECT id, CAST(queue AS CHAR), CAST(group_key AS CHAR) FROM relayq_jobs
                 WHERE deps_left = 0 AND state = 'blocked' AND id IN ",
            );
            push_ids(&mut q, chunk.iter().map(|(child, _)| *child));
            let freed: Vec<(i64, String, Option<String>)> =
                q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
            for (child, queue, group) in freed {
                match group {
                    Some(g) => touched.group(&queue, &g),
                    None => self.free.push(child),
                }
            }
        }
        Ok(())
    }

    /// Makes the freed children ready where their stage is released (SPEC D3); a
    /// child above it waits for the stage's release, which skips jobs still counting.
    pub(crate) async fn ready(self, c: &mut Conn) -> Result<()> {
        ready(c, &self.free).await
    }
}

/// Makes the jobs `ids` (no group, no parent left) ready where their stage is released.
pub(crate) async fn ready(c: &mut Conn, ids: &[i64]) -> Result<()> {
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE relayq_jobs j JOIN relayq_batches b ON b.id = j.batch_id
             SET j.state = 'ready'
             WHERE j.state = 'blocked' AND j.deps_left = 0 AND j.group_key IS NULL
               AND j.stage <= b.released_stage AND j.id IN ",
        );
        push_ids(&mut q, chunk.iter().copied());
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    Ok(())
}

/// A stored parent: its batch, stage and state (`kit::after::Stored`).
pub(crate) use kit::Stored as Parent;

/// The stored jobs an enqueue's jobs name in `after`, those of `queue`: a job of
/// another queue is not found, and `kit::after::check_job` names it unknown.
pub(crate) async fn parents(
    c: &mut Conn,
    queue: &str,
    jobs: &[NewJob],
) -> Result<HashMap<JobId, Parent>> {
    let ids = kit::stored_ids(jobs);
    let mut out = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, batch_id, stage, CAST(state AS CHAR) FROM relayq_jobs WHERE queue = ",
        );
        q.push_bind(queue).push(" AND id IN ");
        push_ids(&mut q, chunk.iter().map(|i| i.0));
        let rows: Vec<(i64, Option<i64>, Option<i64>, String)> =
            q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
        for (id, batch, stage, state) in rows {
            let stage = stage
                .map(i32::try_from)
                .transpose()
                .map_err(Error::backend)?;
            out.insert(JobId(id), (batch, stage, state.parse()?));
        }
    }
    Ok(out)
}

/// Stores the call's edges and each child's count, or stores it cancelled when a
/// stored parent already failed and it keeps `Cancel` (SPEC D4, `kit::after::starts`).
/// Returns the children with nothing left to wait for and no group, for [`ready`].
pub(crate) async fn store(
    c: &mut Conn,
    jobs: &[NewJob],
    out: &[Enqueued],
    stored: &HashMap<JobId, Parent>,
    batch_policy: &HashMap<i64, AfterFailure>,
    touched: &mut promote::Touched,
    now: i64,
) -> Result<Vec<i64>> {
    let edges = kit::edges(jobs.iter().map(|j| j.after.as_slice()), out);
    if edges.is_empty() {
        return Ok(Vec::new());
    }
    for chunk in edges.chunks(CHUNK) {
        let mut q =
            QueryBuilder::<MySql>::new("INSERT INTO relayq_job_deps (parent_id, child_id) ");
        q.push_values(chunk, |mut b, (child, parent)| {
            b.push_bind(parent.0).push_bind(child.0);
        });
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    let policy = |job: &NewJob| kit::policy(job, batch_policy);
    let starts = kit::starts(jobs, out, |id| stored.get(&id).map(|p| p.2), policy);
    let (mut waits, mut cancels, mut free) = (Vec::new(), Vec::new(), Vec::new());
    for (i, start) in starts {
        let (job, id) = (&jobs[i], out[i].id.0);
        match start {
            kit::Start::Waits(left) => {
                let run = policy(job) == AfterFailure::Run;
                waits.push((id, i64::from(left), run));
                if left == 0 {
                    match &job.group {
                        Some(g) => touched.group(&job.queue, g),
                        None => free.push(id),
                    }
                }
            }
            kit::Start::Cancelled { parent, state } => {
                cancels.push((id, relayq_core::cancelled_by::after(parent, state)));
                touched.cancelled(
                    &job.queue,
                    job.group.as_deref(),
                    job.batch.map(|b| b.0),
                    job.batch.map(|_| i64::from(job.stage.unwrap_or(0))),
                );
            }
        }
    }
    for chunk in waits.chunks(CHUNK / 4) {
        let mut q = QueryBuilder::<MySql>::new("UPDATE relayq_jobs SET deps_left = CASE id");
        for (id, left, _) in chunk {
            q.push(" WHEN ")
                .push_bind(*id)
                .push(" THEN ")
                .push_bind(*left);
        }
        q.push(" END, after_failure = CASE id");
        for (id, _, run) in chunk {
            q.push(" WHEN ")
                .push_bind(*id)
                .push(" THEN ")
                .push_bind(run.then_some("run"));
        }
        q.push(" END WHERE id IN ");
        push_ids(&mut q, chunk.iter().map(|w| w.0));
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    for chunk in cancels.chunks(CHUNK / 2) {
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE relayq_jobs SET state = 'cancelled', finished_at = ",
        );
        q.push_bind(now).push(", last_error = CASE id");
        for (id, why) in chunk {
            q.push(" WHEN ")
                .push_bind(*id)
                .push(" THEN ")
                .push_bind(why.clone());
        }
        q.push(" END WHERE id IN ");
        push_ids(&mut q, chunk.iter().map(|w| w.0));
        q.build().execute(&mut *c).await.map_err(db)?;
    }
    Ok(free)
}

/// `(id, id, ...)`, bound.
fn push_ids(q: &mut QueryBuilder<MySql>, ids: impl Iterator<Item = i64>) {
    q.push("(");
    let mut list = q.separated(", ");
    for id in ids {
        list.push_bind(id);
    }
    list.push_unseparated(")");
}
