//! SPEC D: dependencies. What a finished parent does to its children, inside the
//! transaction that finished it and under its batch's lock, and the edges of an
//! enqueue.
//!
//! Every statement finds the jobs it changes by `id = ANY (...)` as well as by its join:
//! with only the join, statistics taken while the table was small planned a hash join
//! over a scan of every job (tests/statistics.rs: 50,153 rows read by an enqueue of 100
//! children, 150,494 by the death of a parent of 50).
//!
//! Why the batch's lock: a child's count reaching 0 and its stage's release are two
//! ways a blocked job becomes ready, each judged from the other's outcome (the count
//! readies a child whose stage is released; the release, one whose count is 0). Two
//! transactions doing one each would each see the other's change uncommitted and
//! leave the child blocked. Both run under the batch's row lock, and each in a
//! statement begun after taking it, so the later one sees what the earlier committed.
//!
//! An enqueue locks the stored parents it names (`FOR KEY SHARE`) before its batches,
//! as a settle holds the rows it finishes before the batch: an enqueue of a child of a
//! parent being settled waits, or is waited for, without a cycle. One cycle is left: a
//! settle whose failed parent cancels a blocked child (under the batch's lock) while an
//! enqueue names that child as a parent (holding its row, waiting for the batch).
//! PostgreSQL breaks it after `deadlock_timeout` and the loser's call runs again
//! (`retry_transient`; in `enqueue_in`, the caller's transaction gets the error).

use std::collections::HashMap;

use relayq_core::{
    AfterFailure, Enqueued, Error, JobId, JobState, NewJob, Result, kit::after as kit,
};
use sqlx::PgConnection;

use crate::{
    db,
    promote::{Touched, archive},
    schema::Schema,
};

/// Which of the parents (ids `$1`, batches `$2`) have a child: their batches.
const BATCHES_WITH_CHILDREN: &str = "SELECT DISTINCT p.batch
    FROM unnest($1::bigint[], $2::bigint[]) AS p(id, batch)
    WHERE EXISTS (SELECT 1 FROM {s}.job_deps d WHERE d.parent_id = p.id)";

/// SPEC D4: the blocked children of the failed parents (`$1`, each with the error
/// `$2` its children get) that keep the `Cancel` policy are cancelled. They never
/// started: a child waits for all its parents.
const CASCADE: &str = concat!(
    "WITH p AS (SELECT * FROM unnest($1::bigint[], $2::text[]) AS p(id, why)),
    c AS (SELECT DISTINCT ON (d.child_id) d.child_id AS id, p.why
          FROM p JOIN {s}.job_deps d ON d.parent_id = p.id
          ORDER BY d.child_id, p.id),
    g AS (DELETE FROM {s}.jobs j USING c
          WHERE j.id = ANY (ARRAY(SELECT id FROM c)) AND j.id = c.id AND j.state = 'blocked'
            AND j.after_failure IS DISTINCT FROM 'run'
          RETURNING j.*, c.why),
    archived AS (",
    archive!("g", "'cancelled'", "g.why"),
    ")
    SELECT id, queue, group_key, batch_id, stage FROM g"
);

/// SPEC D2: each blocked child of the parents `$1` counts them off; a child left with
/// none, without a group, whose stage is released, is ready. Returns the children left
/// with none: their queue, group and state.
const COUNT_OFF: &str = "
    WITH c AS (SELECT d.child_id AS id, count(*)::int AS n FROM {s}.job_deps d
               WHERE d.parent_id = ANY($1) GROUP BY d.child_id),
    u AS (UPDATE {s}.jobs j
          SET deps_left = j.deps_left - c.n,
              state = CASE WHEN j.deps_left = c.n AND j.group_key IS NULL
                            AND j.stage <= (SELECT b.released_stage FROM {s}.batches b
                                            WHERE b.id = j.batch_id)
                           THEN 'ready' ELSE j.state END
          FROM c WHERE j.id = ANY (ARRAY(SELECT id FROM c)) AND j.id = c.id
            AND j.state = 'blocked'
          RETURNING j.queue, j.group_key, j.deps_left, j.state)
    SELECT queue, group_key, state::text FROM u WHERE deps_left = 0";

/// The batches of `parents` (id, batch) not among `known` whose parent has a child:
/// their lock must be taken before the children are counted off.
pub(crate) async fn batches_with_children(
    c: &mut PgConnection,
    s: &Schema,
    parents: &[(i64, i64)],
) -> Result<Vec<i64>> {
    let (ids, batches): (Vec<i64>, Vec<i64>) = parents.iter().copied().unzip();
    sqlx::query_scalar(s.sql(BATCHES_WITH_CHILDREN))
        .bind(&ids)
        .bind(&batches)
        .fetch_all(c)
        .await
        .map_err(db)
}

/// A child [`CASCADE`] cancelled: id, queue, group, batch and stage.
type Child = (i64, String, Option<String>, Option<i64>, Option<i32>);

/// Cancels the children of failed parents down the graph, then counts every parent off
/// its remaining children; what becomes ready or gets its group's turn goes to `t`.
/// The caller holds the parents' batches' locks.
pub(crate) async fn settle(
    c: &mut PgConnection,
    s: &Schema,
    t: &mut Touched,
    parents: &[(i64, i64, JobState)],
) -> Result<()> {
    let mut all: Vec<i64> = parents.iter().map(|p| p.0).collect();
    let mut failed: Vec<(i64, String)> = parents
        .iter()
        .filter(|p| matches!(p.2, JobState::Dead | JobState::Cancelled))
        .map(|p| (p.0, relayq_core::cancelled_by::after(JobId(p.0), p.2)))
        .collect();
    while !failed.is_empty() {
        let (ids, whys): (Vec<i64>, Vec<String>) = failed.drain(..).unzip();
        let rows: Vec<Child> = sqlx::query_as(s.sql(CASCADE))
            .bind(&ids)
            .bind(&whys)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        for (id, queue, group, batch, stage) in rows {
            t.left(&queue, group.as_deref(), batch, stage, JobState::Cancelled);
            let why = relayq_core::cancelled_by::after(JobId(id), JobState::Cancelled);
            failed.push((id, why));
            all.push(id);
        }
    }
    let freed: Vec<(String, Option<String>, String)> = sqlx::query_as(s.sql(COUNT_OFF))
        .bind(&all)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    for (queue, group, state) in freed {
        match group {
            Some(g) => t.group(&queue, &g),
            None if state == "ready" => {
                t.ready.insert(queue);
            }
            None => {}
        }
    }
    Ok(())
}

pub(crate) use kit::Stored as Parent;

/// The stored jobs the call's jobs run after, as they are now. Unfinished ones are
/// locked `FOR KEY SHARE`, before the batches' lock as a settle locks its rows before
/// it: a settle that finishes one meanwhile waits for this commit, and then counts the
/// new child off (its count-off statement begins after the lock it waits for); one
/// that finished it first is waited for here, and the parent is then read finished.
pub(crate) async fn parents(
    c: &mut PgConnection,
    s: &Schema,
    queue: &str,
    jobs: &[NewJob],
) -> Result<HashMap<JobId, Parent>> {
    let ids: Vec<i64> = kit::stored_ids(jobs).iter().map(|i| i.0).collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    type Row = (i64, Option<i64>, Option<i32>, String);
    let mut rows: Vec<Row> = sqlx::query_as(s.sql(
        "SELECT id, batch_id, stage, state::text FROM {s}.jobs
         WHERE id = ANY($1) AND queue = $2 ORDER BY id FOR KEY SHARE",
    ))
    .bind(&ids)
    .bind(queue)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    let live: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let gone: Vec<i64> = ids.into_iter().filter(|i| !live.contains(i)).collect();
    if !gone.is_empty() {
        let done: Vec<Row> = sqlx::query_as(s.sql(
            "SELECT id, batch_id, stage, state::text FROM {s}.finished
             WHERE id = ANY($1) AND queue = $2",
        ))
        .bind(&gone)
        .bind(queue)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
        rows.extend(done);
    }
    rows.into_iter()
        .map(|(id, b, st, state)| Ok((JobId(id), (b, st, state.parse()?))))
        .collect()
}

/// New children's counts and policies; one with nothing left to wait for, without a
/// group, in a released stage, is ready at once (the batch is locked).
const SET_WAITS: &str = "
    WITH w AS (SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[]) AS w(id, n, policy))
    UPDATE {s}.jobs j SET deps_left = w.n, after_failure = w.policy,
        state = CASE WHEN w.n = 0 AND j.group_key IS NULL
                      AND j.stage <= (SELECT b.released_stage FROM {s}.batches b
                                      WHERE b.id = j.batch_id)
                     THEN 'ready' ELSE j.state END
    FROM w WHERE j.id = ANY($1) AND j.id = w.id";

/// New children of a parent that already failed, cancelled at once (SPEC D4).
const SET_CANCELLED: &str = concat!(
    "WITH c AS (SELECT * FROM unnest($1::bigint[], $2::text[]) AS c(id, why)),
    g AS (DELETE FROM {s}.jobs j USING c WHERE j.id = ANY($1) AND j.id = c.id
          RETURNING j.*, c.why),
    archived AS (",
    archive!("g", "'cancelled'", "g.why"),
    ")
    SELECT count(*) FROM g"
);

/// Stores the call's edges and each new child's count of unfinished parents; a child
/// of a parent that already failed follows its policy (SPEC D4).
pub(crate) async fn store(
    c: &mut PgConnection,
    s: &Schema,
    jobs: &[NewJob],
    out: &[Enqueued],
    stored: &HashMap<JobId, Parent>,
    batch_policy: &HashMap<i64, AfterFailure>,
    t: &mut Touched,
) -> Result<()> {
    let edges = kit::edges(jobs.iter().map(|j| j.after.as_slice()), out);
    if edges.is_empty() {
        return Ok(());
    }
    let (children, parents): (Vec<i64>, Vec<i64>) = edges.iter().map(|(c, p)| (c.0, p.0)).unzip();
    sqlx::query(s.sql(
        "INSERT INTO {s}.job_deps (parent_id, child_id)
         SELECT * FROM unnest($1::bigint[], $2::bigint[])",
    ))
    .bind(&parents)
    .bind(&children)
    .execute(&mut *c)
    .await
    .map_err(db)?;
    let policy = |job: &NewJob| kit::policy(job, batch_policy);
    let starts = kit::starts(jobs, out, |id| stored.get(&id).map(|p| p.2), policy);
    let (mut ids, mut counts, mut policies) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cancelled, mut whys) = (Vec::new(), Vec::new());
    for (i, start) in starts {
        let job = &jobs[i];
        match start {
            kit::Start::Waits(left) => {
                ids.push(out[i].id.0);
                counts.push(i32::try_from(left).map_err(Error::backend)?);
                policies.push((policy(job) == AfterFailure::Run).then_some("run"));
                if left == 0 {
                    t.ready.insert(job.queue.clone());
                }
            }
            kit::Start::Cancelled { parent, state } => {
                cancelled.push(out[i].id.0);
                whys.push(relayq_core::cancelled_by::after(parent, state));
                t.left(
                    &job.queue,
                    job.group.as_deref(),
                    job.batch.map(|b| b.0),
                    job.batch.map(|_| job.stage.unwrap_or(0)),
                    JobState::Cancelled,
                );
            }
        }
    }
    if !ids.is_empty() {
        sqlx::query(s.sql(SET_WAITS))
            .bind(&ids)
            .bind(&counts)
            .bind(&policies)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    if !cancelled.is_empty() {
        sqlx::query(s.sql(SET_CANCELLED))
            .bind(&cancelled)
            .bind(&whys)
            .execute(&mut *c)
            .await
            .map_err(db)?;
    }
    Ok(())
}
