//! SPEC L: settling leases, each fenced by its token, many in one transaction.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    AttemptOutcome, Complete, Error, EventKind, JobId, JobState, Lease, Outcome, ProgressReport,
    Result, Settle, Settled,
};

use crate::{Conn, Ended, SqliteBackend, at, db, log_attempt, plus, promote, us};

/// The job row after a fenced update.
#[derive(sqlx::FromRow)]
struct After {
    state: String,
    run_at: i64,
    attempts: i64,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i64>,
    worker: String,
    started_at: i64,
}

// Every statement below only touches the row while the lease holds: same job, same
// token, still running, not expired (SPEC L1).
pub(crate) const COMPLETE: &str = "UPDATE relayq_jobs
    SET state = 'succeeded', finished_at = ?3, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";
pub(crate) const FAIL: &str = "UPDATE relayq_jobs
    SET state = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN 'retrying' ELSE 'dead' END,
        run_at = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN ?5 ELSE run_at END,
        finished_at = CASE WHEN attempts < max_attempts AND ?5 IS NOT NULL THEN NULL ELSE ?3 END,
        last_error = ?6, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";
/// As before the claim (SPEC L4): `retrying` when an earlier attempt counted (it failed
/// or expired), so the job keeps holding its group (SPEC G2); `ready` otherwise.
/// Attempts spent before a dead retry (`max_attempts` less `budget`, SPEC M2) do not
/// count: it came back ready.
pub(crate) const RELEASE: &str = "UPDATE relayq_jobs
    SET state = CASE WHEN attempts > 1 + max_attempts - coalesce(budget, max_attempts)
                     THEN 'retrying' ELSE 'ready' END,
        attempts = attempts - 1, lease_token = NULL, lease_expires_at = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?4
    RETURNING state, run_at, attempts, group_key, batch_id, stage, worker, started_at";
pub(crate) const HEARTBEAT: &str = "UPDATE relayq_jobs SET lease_expires_at = ?4
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND lease_expires_at > ?3
      AND queue = ?5
    RETURNING id";

#[async_trait]
impl Complete for SqliteBackend {
    /// 512: each call takes the database's one write lock and commits, a cost per call
    /// beyond its leases; a draining worker's claims of about 130 jobs then fit in one
    /// call instead of being cut at 128.
    fn preferred_settle_batch(&self) -> usize {
        512
    }

    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        if settles.is_empty() {
            return Ok(Vec::new());
        }
        let (mut tx, now) = self.write().await?;
        let mut touched = promote::Touched::default();
        let out = if completions_alone(&settles) {
            complete_all(&mut tx, &settles, now, &mut touched).await?
        } else {
            let mut out = Vec::with_capacity(settles.len());
            for s in &settles {
                out.push(settle_one(&mut tx, s, now, &mut touched).await?);
            }
            out
        };
        touched.promote(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        let mut queues: Vec<&str> = settles
            .iter()
            .zip(&out)
            .filter(|(_, r)| r.is_ok())
            .map(|(s, _)| s.lease.queue.as_str())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        // A dead job may have halted its batch, cancelling running jobs (SPEC B6, B8).
        for (s, _) in settles
            .iter()
            .zip(&out)
            .filter(|(_, r)| matches!(r, Ok(Settled::Dead)))
        {
            self.notify(&s.lease.queue, EventKind::Revoked);
        }
        for q in queues {
            self.notify(q, EventKind::Finished);
            self.notify(q, EventKind::Ready);
        }
        Ok(out)
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        let (mut tx, now) = self.write().await?;
        // As stored (whole microseconds), like a claim's expiry.
        let until = crate::at(us(plus(now, extend)));
        let held: Option<i64> = sqlx::query_scalar(HEARTBEAT)
            .bind(lease.job.0)
            .bind(lease.token.0.as_bytes().as_slice())
            .bind(us(now))
            .bind(us(until))
            .bind(&lease.queue)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        held.map(|_| until).ok_or(Error::StaleLease)
    }

    /// A read on a pooled connection, outside the writers' turn: in WAL mode it waits
    /// for no writer.
    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let json = leases_json(leases.iter().map(|l| (l, None)));
        let ids: Vec<i64> = sqlx::query_scalar(LOST)
            .bind(json)
            .fetch_all(self.pool())
            .await
            .map_err(db)?;
        Ok(ids.into_iter().map(JobId).collect())
    }

    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.beat(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let stored: Vec<String> = reports.iter().map(ProgressReport::stored).collect();
        let json = leases_json(
            reports
                .iter()
                .zip(&stored)
                .map(|(r, p)| (&r.lease, Some(p))),
        );
        let (mut tx, _) = self.write().await?;
        let written: Vec<i64> = sqlx::query_scalar(PROGRESS)
            .bind(json)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(reports
            .iter()
            .map(|r| r.lease.job)
            .filter(|id| !written.contains(&id.0))
            .collect())
    }
}

/// SPEC L7: stores each lease's progress (see [`leases_json`], its fourth element) on
/// its job while the job is `running` under that token; returns the ids written. An
/// upsert whose pinned `CROSS JOIN` looks each job up by rowid from the leases' side,
/// as [`COMPLETE_ALL`] does and for its reason (an `UPDATE ... FROM` scanned the jobs
/// once the table was analyzed while small); the `+` keeps the running index out.
pub(crate) const PROGRESS: &str = "INSERT INTO relayq_jobs
         (id, queue, state, payload, priority, run_at, max_attempts, created_at, progress)
     SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at,
            l.value ->> 3
     FROM json_each(?1) AS l CROSS JOIN relayq_jobs AS j
     ON j.id = l.value ->> 0 AND j.lease_token = unhex(l.value ->> 1) AND +j.state = 'running'
     WHERE true
     ON CONFLICT (id) DO UPDATE SET progress = excluded.progress
     RETURNING id";

/// SPEC B8: the leases of `?1` (see [`leases_json`]) whose job is not `running` under
/// that token. Each job is looked up by rowid from the leases' side; the `+` keeps the
/// running index out of the look-up, as in [`held!`].
pub(crate) const LOST: &str = "SELECT DISTINCT l.value ->> 0 FROM json_each(?1) AS l
    WHERE NOT EXISTS (SELECT 1 FROM relayq_jobs AS j
        WHERE j.id = l.value ->> 0 AND j.lease_token = unhex(l.value ->> 1)
          AND +j.state = 'running')";

/// Whether `settles` are completions only, each of its own job: the call a draining
/// worker makes, which [`complete_all`] serves in two statements. A job named twice
/// goes one lease at a time, where the second entry sees what the first did.
fn completions_alone(settles: &[Settle]) -> bool {
    let mut ids = std::collections::HashSet::with_capacity(settles.len());
    settles
        .iter()
        .all(|s| matches!(s.outcome, Outcome::Complete) && ids.insert(s.lease.job.0))
}

/// The leases of [`COMPLETE_ALL`] and [`LOG_COMPLETED`]: a JSON array of `[id, token
/// in hex, queue, output or null]`.
fn leases_json<'a>(leases: impl Iterator<Item = (&'a Lease, Option<&'a String>)>) -> String {
    settles_json(leases.map(|(l, output)| (l, output, 0)))
}

/// [`leases_json`] with a fifth element: how long each job waited in its worker before
/// its handler started, in microseconds (SPEC L5).
fn settles_json<'a>(leases: impl Iterator<Item = (&'a Lease, Option<&'a String>, i64)>) -> String {
    let leases: Vec<_> = leases
        .map(|(l, output, waited)| {
            let token = l.token.0.simple().to_string();
            serde_json::json!([l.job.0, token, l.queue, output, waited])
        })
        .collect();
    serde_json::Value::Array(leases).to_string()
}

/// The jobs of the leases `?2` (see [`leases_json`]) that still hold at `?1`: the
/// lease checks of [`COMPLETE`], each job found by its id.
///
/// The leases are the outer loop and each job is looked up by rowid, whatever the
/// statistics. With a plain `JOIN`, once `ANALYZE` had run while few jobs
/// ran, SQLite put the jobs outside, read from `relayq_jobs_running` (every running
/// job of the file), and scanned the leases once per running job: 60,269 steps to
/// complete 50 jobs with 100 running, 9,474 before any `ANALYZE`, and growing with
/// running jobs times leases. `CROSS JOIN` fixes the order: SQLite never reorders
/// its two sides. The `+` on the other columns takes every index of `relayq_jobs`
/// out of the inner loop's choice (`+j.state` no longer matches the running index's
/// `WHERE`, `+j.queue` no longer a key of the state index), so what is left is the
/// rowid look-up or a scan of the table per lease, and no estimate of the table's
/// size makes a scan cheaper than one look-up.
macro_rules! held {
    () => {
        "FROM json_each(?2) AS l CROSS JOIN relayq_jobs AS j
         ON j.id = l.value ->> 0 AND j.lease_token = unhex(l.value ->> 1)
            AND +j.state = 'running' AND +j.lease_expires_at > ?1
            AND +j.queue = l.value ->> 2"
    };
}

/// Logs the succeeded attempt of every lease that holds. Runs before [`COMPLETE_ALL`],
/// in the same transaction, so both find the same leases.
pub(crate) const LOG_COMPLETED: &str = concat!(
    "INSERT INTO relayq_attempts
         (job_id, attempt, worker, started_at, ended_at, outcome, error, output, claimed_at)
     SELECT j.id, j.attempts, j.worker, min(j.started_at + coalesce(l.value ->> 4, 0), ?1),
            ?1, 'succeeded', NULL, l.value ->> 3, j.started_at ",
    held!()
);

/// [`COMPLETE`] for every lease that holds.
///
/// An upsert, not `UPDATE relayq_jobs AS j ... FROM json_each(?2) AS l`: an
/// `UPDATE ... FROM` joins its target in an order the planner picks, and no syntax
/// fixes it; this is how it flipped (see [`held!`]). Here the `SELECT` is the pinned
/// join, and each row it finds is updated through the primary key's conflict check,
/// a seek the planner does not choose (as the claim does, see `claim::CLAIM`). Every
/// id comes from the table in this statement, so none is inserted; the `NOT NULL`
/// columns are filled only to pass the checks that come before the conflict's.
/// `WHERE true` is SQLite's required guard between an `INSERT ... SELECT` and its
/// `ON CONFLICT`.
pub(crate) const COMPLETE_ALL: &str = concat!(
    "INSERT INTO relayq_jobs
         (id, queue, state, payload, priority, run_at, max_attempts, created_at)
     SELECT j.id, j.queue, j.state, X'', j.priority, j.run_at, j.max_attempts, j.created_at ",
    held!(),
    " WHERE true
     ON CONFLICT (id) DO UPDATE
     SET state = 'succeeded', finished_at = ?1, lease_token = NULL, lease_expires_at = NULL
     RETURNING id, group_key, batch_id, stage"
);

/// A row of [`COMPLETE_ALL`]: id, group, batch, stage.
type Completed = (i64, Option<String>, Option<i64>, Option<i64>);

/// Settles completions of distinct jobs ([`completions_alone`]) in two statements
/// where one lease at a time takes two each. A statement costs this backend more than
/// its work: sqlx runs each on the connection's own thread, and the hand-offs there
/// and back were most of a drain's time (two statements instead of 1,024 for a call of
/// 512 more than doubled the prefetch drain).
async fn complete_all(
    c: &mut Conn,
    settles: &[Settle],
    now: DateTime<Utc>,
    touched: &mut promote::Touched,
) -> Result<Vec<Result<Settled>>> {
    let leases = settles_json(
        settles
            .iter()
            .map(|s| (&s.lease, s.output.as_ref(), s.waited_micros())),
    );
    sqlx::query(LOG_COMPLETED)
        .bind(us(now))
        .bind(&leases)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    let done: Vec<Completed> = sqlx::query_as(COMPLETE_ALL)
        .bind(us(now))
        .bind(&leases)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
    let mut out: Vec<Result<Settled>> = settles.iter().map(|_| Err(Error::StaleLease)).collect();
    let index: std::collections::HashMap<i64, usize> = settles
        .iter()
        .enumerate()
        .map(|(i, s)| (s.lease.job.0, i))
        .collect();
    for (id, group, batch, stage) in done {
        let i = *index
            .get(&id)
            .ok_or_else(|| Error::backend("a completion returned a job it was not given"))?;
        out[i] = Ok(Settled::Completed);
        let f = promote::Finished {
            id,
            queue: &settles[i].lease.queue,
            group: group.as_deref(),
            batch,
            stage,
            state: JobState::Succeeded,
        };
        touched.finished(c, &f, now).await?;
    }
    Ok(out)
}

/// Settles one lease inside the transaction. The outer error is a database failure
/// (the whole call fails); the inner one is this lease's verdict.
async fn settle_one(
    c: &mut Conn,
    s: &Settle,
    now: DateTime<Utc>,
    touched: &mut promote::Touched,
) -> Result<Result<Settled>> {
    let (sql, error, retry_at) = match &s.outcome {
        Outcome::Complete => (COMPLETE, None, None),
        Outcome::Fail { error, retry } => {
            let retry_at = retry.delay(s.lease.attempt, now).map(|d| us(plus(now, d)));
            (FAIL, Some(error.as_str()), retry_at)
        }
        Outcome::Release => (RELEASE, None, None),
    };
    let mut query = sqlx::query_as::<_, After>(sql)
        .bind(s.lease.job.0)
        .bind(s.lease.token.0.as_bytes().as_slice())
        .bind(us(now))
        .bind(&s.lease.queue);
    if matches!(s.outcome, Outcome::Fail { .. }) {
        query = query.bind(retry_at).bind(error);
    }
    let row = query.fetch_optional(&mut *c).await.map_err(db)?;
    let Some(row) = row else {
        return Ok(Err(Error::StaleLease));
    };
    let (outcome, attempt, settled) = match (&s.outcome, row.state.as_str()) {
        (Outcome::Complete, _) => (AttemptOutcome::Succeeded, row.attempts, Settled::Completed),
        (Outcome::Release, _) => (
            AttemptOutcome::Released,
            row.attempts + 1,
            Settled::Released,
        ),
        (Outcome::Fail { .. }, "retrying") => (
            AttemptOutcome::Failed,
            row.attempts,
            Settled::Retrying { at: at(row.run_at) },
        ),
        (Outcome::Fail { .. }, _) => (AttemptOutcome::Failed, row.attempts, Settled::Dead),
    };
    let ended = Ended {
        job: s.lease.job.0,
        attempt,
        worker: &row.worker,
        // The handler's start: the claim plus its wait in the worker (SPEC L5).
        started_at: row
            .started_at
            .saturating_add(s.waited_micros())
            .min(us(now)),
        claimed_at: row.started_at,
        ended_at: now,
        outcome,
        error,
        output: s.output.as_deref(),
    };
    log_attempt(c, ended).await?;
    let finished = match settled {
        Settled::Completed => Some(JobState::Succeeded),
        Settled::Dead => Some(JobState::Dead),
        Settled::Retrying { .. } | Settled::Released => None,
    };
    if let (Settled::Released, Some(group)) = (settled, row.group_key.as_deref())
        && row.state == "ready"
    {
        // A released job no longer holds its group: an earlier job of the group whose
        // stage was released meanwhile goes first (SPEC G2). A released retry holds it
        // still.
        touched.group(&s.lease.queue, group);
    }
    if let Some(state) = finished {
        let f = promote::Finished {
            id: s.lease.job.0,
            queue: &s.lease.queue,
            group: row.group_key.as_deref(),
            batch: row.batch_id,
            stage: row.stage,
            state,
        };
        touched.finished(c, &f, now).await?;
    }
    Ok(Ok(settled))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both statements of [`complete_all`] find each job by its id, whatever the call's
    /// size: a scan of the table would make every settle as slow as the backlog is large.
    #[tokio::test]
    async fn completions_find_jobs_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("plan.db").display());
        let backend = SqliteBackend::open(&url).await.unwrap();
        for sql in [LOG_COMPLETED, COMPLETE_ALL] {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind(0_i64)
                    .bind("[]")
                    .fetch_all(backend.pool())
                    .await
                    .unwrap();
            let detail: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
            assert!(
                detail.iter().any(|d| d.starts_with("SCAN l VIRTUAL TABLE"))
                    && detail
                        .iter()
                        .any(|d| d.starts_with("SEARCH j USING INTEGER PRIMARY KEY")),
                "{sql}\n{detail:?}"
            );
        }
    }
}
