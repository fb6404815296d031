//! SPEC L1, L5: a settle call of completions alone, in three statements whatever its
//! size: the held rows read by id, one `UPDATE` of them by id, one insert into the
//! log. A call with any other outcome goes one lease at a time (`settle.rs`): a dead
//! job may halt its batch and cancel a job settled later in the same call.

use std::collections::{HashMap, HashSet};

use relayq_core::{AttemptOutcome, Error, JobState, Outcome, Result, Settle, Settled};
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, Ended, db, log_attempts, promote};

/// A held row as the batch reads it.
#[derive(sqlx::FromRow)]
struct Held {
    id: i64,
    lease_token: Option<Vec<u8>>,
    queue: String,
    attempts: i64,
    worker: String,
    started_at: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    limit_key: Option<String>,
}

/// Whether `settles` are completions of distinct jobs only.
pub(crate) fn alone(settles: &[Settle]) -> bool {
    let mut ids = HashSet::with_capacity(settles.len());
    settles
        .iter()
        .all(|s| matches!(s.outcome, Outcome::Complete) && ids.insert(s.lease.job.0))
}

/// Completes every lease of `settles` that holds (same job, token and queue, running,
/// not expired at `now`), inside the caller's transaction holding their queues'
/// locks; the others are stale.
pub(crate) async fn complete_all(
    c: &mut Conn,
    settles: &[Settle],
    now: i64,
    touched: &mut promote::Touched,
) -> Result<Vec<Result<Settled>>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, lease_token, CAST(queue AS CHAR) AS queue, attempts,
             CAST(COALESCE(worker, '') AS CHAR) AS worker,
             COALESCE(started_at, 0) AS started_at, CAST(group_key AS CHAR) AS group_key,
             batch_id, stage, CAST(limit_key AS CHAR) AS limit_key
         FROM relayq_jobs WHERE state = 'running' AND lease_expires_at > ",
    );
    q.push_bind(now).push(" AND id IN (");
    let mut list = q.separated(", ");
    for s in settles {
        list.push_bind(s.lease.job.0);
    }
    list.push_unseparated(")");
    let rows: Vec<Held> = q.build_query_as().fetch_all(&mut *c).await.map_err(db)?;
    let rows: HashMap<i64, Held> = rows.into_iter().map(|r| (r.id, r)).collect();
    let mut out: Vec<Result<Settled>> = settles.iter().map(|_| Err(Error::StaleLease)).collect();
    let mut held = Vec::new();
    for (i, s) in settles.iter().enumerate() {
        let Some(r) = rows.get(&s.lease.job.0) else {
            continue;
        };
        let token = r.lease_token.as_deref() == Some(s.lease.token.0.as_bytes().as_slice());
        if token && r.queue == s.lease.queue {
            out[i] = Ok(Settled::Completed);
            held.push((s, r));
        }
    }
    if held.is_empty() {
        return Ok(out);
    }
    let mut q = QueryBuilder::<MySql>::new(
        "UPDATE relayq_jobs SET state = 'succeeded', lease_token = NULL,
             lease_expires_at = NULL, finished_at = ",
    );
    q.push_bind(now).push(" WHERE id IN (");
    let mut list = q.separated(", ");
    for (_, r) in &held {
        list.push_bind(r.id);
    }
    list.push_unseparated(")");
    q.build().execute(&mut *c).await.map_err(db)?;
    let ended: Vec<Ended<'_>> = held
        .iter()
        .map(|(s, r)| Ended {
            job: r.id,
            attempt: r.attempts,
            worker: &r.worker,
            // The handler's start: the claim plus its wait in the worker (SPEC L5).
            started_at: r.started_at.saturating_add(s.waited_micros()).min(now),
            claimed_at: r.started_at,
            ended_at: now,
            outcome: AttemptOutcome::Succeeded,
            error: None,
            output: s.output.as_deref(),
        })
        .collect();
    log_attempts(c, &ended).await?;
    for (_, r) in &held {
        // Its key's slot is free (SPEC K2).
        crate::keys::freed(c, &r.queue, r.limit_key.as_deref()).await?;
        let f = promote::Finished {
            id: r.id,
            queue: &r.queue,
            group: r.group_key.as_deref(),
            batch: r.batch_id,
            stage: r.stage,
            state: JobState::Succeeded,
        };
        touched.finished(c, &f, now).await?;
    }
    Ok(out)
}
