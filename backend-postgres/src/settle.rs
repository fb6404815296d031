//! SPEC L: settling leases, many in one statement, each fenced by its own token.

use std::{collections::HashSet, time::Duration};

use crate::{
    PostgresBackend, db, listen, micros,
    promote::{self, Touched, archive},
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    Complete, Error, JobId, JobState, Lease, Outcome, ProgressReport, Result, Retry, Settle,
    Settled, retry::retry_transient,
};
use sqlx::{Row as _, postgres::PgRow};

/// The settles as arrays `i` (one row per lease, numbered `ord`).
macro_rules! settle_inputs {
    () => {
        "WITH i AS (
            SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[],
                                 $5::bigint[], $6::timestamptz[], $7::text[], $8::text[],
                                 $11::bigint[])
                WITH ORDINALITY AS i(id, token, queue, kind, delay_us, retry_at, error,
                                     output, waited_us, ord)),"
    };
}

/// The place of row `j` in the statement's arrays: `$1` holds distinct ids in ascending
/// order (see `rounds`), so a binary search finds it. Each row's inputs are read
/// through it, so the statements change rows found by `j.id = ANY(...)` and join
/// nothing to `jobs`: see [`SETTLE`].
macro_rules! at {
    () => {
        "width_bucket(j.id, $1::bigint[])"
    };
}

/// What follows the settled rows `m`: the witnesses, the notifications and the result
/// rows (see [`SETTLE`]).
macro_rules! settle_tail {
    () => {
        "fin AS (
            SELECT batch_id, min(queue) AS queue, min(stage) AS low FROM m
            WHERE batch_id IS NOT NULL AND next IN ('succeeded', 'dead')
            GROUP BY batch_id HAVING bool_and(next = 'succeeded')),
        wit AS MATERIALIZED (
            SELECT f.batch_id FROM fin f CROSS JOIN LATERAL (
                SELECT w.id FROM (
                    SELECT c.id FROM {s}.jobs c
                    WHERE c.queue = f.queue AND c.state IN ('ready', 'retrying') AND NOT c.parked
                    ORDER BY c.priority DESC, c.run_at DESC, c.id DESC LIMIT 16) c
                CROSS JOIN LATERAL (
                    SELECT w.id FROM {s}.jobs w
                    WHERE w.id = c.id AND w.batch_id IS NOT DISTINCT FROM f.batch_id
                      AND w.stage <= f.low AND NOT w.parked
                      AND w.state IN ('ready', 'retrying')
                    FOR KEY SHARE SKIP LOCKED) w
                LIMIT 1) w),
        note AS MATERIALIZED (
            SELECT count(pg_notify($9, $10 || queue)) AS n FROM (
                SELECT DISTINCT queue FROM m
                WHERE batch_id IS NOT NULL AND next IN ('succeeded', 'dead')) q)
        SELECT ord, next, retry_at, queue, group_key, batch_id, stage,
               COALESCE(batch_id IN (SELECT batch_id FROM wit), false) AS witnessed,
               (SELECT n FROM note) AS notified
        FROM m"
    };
}

/// Settles the leases given as arrays (one element per lease, in id order). Only rows
/// still held by the given token, running and unexpired, are touched (SPEC L1):
/// finished ones move to `finished`, retrying and released ones stay, and every ended
/// attempt goes to the log: a succeeded one onto its `finished` row, the others into
/// `attempts`. Returns one row per settled lease.
///
/// Each lease's row is locked through its primary key, one after another in the
/// arrays' order, so concurrent settles lock in id order; a row whose token no longer
/// matches is not locked (the token is checked again on the newest row version after
/// a wait). The `OFFSET 0` keeps the other lease checks out of that lookup: with the
/// state and expiry inside, a table analyzed while nothing ran looks to have no
/// running rows, and the planner read every running job through the running index
/// instead (`tests/postgres.rs` checks both plans).
///
/// The locked rows are then deleted or updated by id (`id = ANY (ARRAY(...))`), each
/// reading its inputs from the arrays through [`at!`]; `m` carries every column the
/// archive needs. Nothing joins `jobs` to `m`: planned from the table's estimated size,
/// such a join walked the whole primary key once a drained table was analyzed, a
/// settle of 50 reading 50,000 rows (`tests/statistics.rs`).
///
/// **Witnesses.** Finishing batch jobs can release the batch's next stage, which
/// promotion decides under the batch row's lock, after the statement, so that it sees
/// every other settle's deletes. Most settles release nothing: another job of the
/// batch, at a stage no higher than the lowest one this settle finishes, stays
/// unfinished. The statement takes one such job `FOR KEY SHARE SKIP LOCKED` as a
/// witness (`wit`), and then the batch needs no lock and no promotion: the stage
/// floor cannot move while the witness is unfinished, and whatever finishes the
/// witness (a settle's `FOR UPDATE`, a cancel's `DELETE`) must wait for this
/// transaction's commit, so its own promotion sees these deletes.
///
/// - `SKIP LOCKED`: a candidate another transaction holds is skipped, not waited for
///   (following a just-claimed candidate's update chain, PostgreSQL may still wait
///   for a settle of it in flight; a review read it so, not measured).
/// - The witness is one of the 16 jobs a claim of its queue would take last (the
///   claim index read backwards): looking for it costs the same at any size of the
///   stage, and it is the job least likely to be claimed and settled while this
///   transaction holds it (that settle would wait for this commit). Only a waiting
///   job (`ready`, `retrying`) can be one: were running jobs witnesses, a running
///   job's settle could be overtaken again and again by settles taking it as their
///   witness, past its lease. Claims lock `FOR NO KEY UPDATE`, which a witness does
///   not block, so they keep their order. Each candidate is looked up by primary
///   key: `IS NOT DISTINCT FROM` (`f.batch_id` is never null) keeps the stage index
///   out, which a table analyzed without batch jobs makes look cheaper, and which
///   would then be walked for every candidate (`tests/postgres.rs` checks the plan).
/// - A settle that kills a job takes no witness for its batch (`HAVING`): a halt
///   (SPEC B6) must run under the batch's lock, taken before the halt's statement, so
///   that its snapshot sees every job that joined the batch meanwhile.
/// - A settle that finds no witness promotes under the lock as before: the settles at
///   the end of each stage, when every job left in it is running, and those whose
///   queue's last 16 jobs belong to other batches or none.
///
/// The statement also sends the `finished` notification of each queue where batch jobs
/// finished (`note`), and returns how many it sent.
const SETTLE: &str = concat!(
    settle_inputs!(),
    "m AS MATERIALIZED (
        SELECT j.*, i.kind, i.error, i.output, i.ord,
               -- The handler's start (SPEC L5): the claim plus its wait in the worker.
               LEAST(j.started_at + i.waited_us::float8 * interval '1 microsecond', now())
                   AS began,
               CASE
                   WHEN i.kind = 'complete' THEN 'succeeded'
                   WHEN i.kind = 'release' THEN 'ready'
                   WHEN j.attempts < j.max_attempts
                        AND (i.delay_us IS NOT NULL OR i.retry_at IS NOT NULL) THEN 'retrying'
                   ELSE 'dead'
               END AS next,
               CASE WHEN i.retry_at IS NOT NULL THEN GREATEST(i.retry_at, now())
                    ELSE now() + i.delay_us::float8 * interval '1 microsecond'
               END AS retry_at
        FROM i CROSS JOIN LATERAL (
            SELECT * FROM {s}.jobs j WHERE j.id = i.id AND j.lease_token = i.token
            OFFSET 0 FOR UPDATE) j
        WHERE j.queue = i.queue AND j.state = 'running' AND j.lease_expires_at > now()),
    g AS (
        DELETE FROM {s}.jobs j
        WHERE j.id = ANY (ARRAY(SELECT id FROM m WHERE next IN ('succeeded', 'dead')))
          AND EXISTS (SELECT 1 FROM m WHERE next IN ('succeeded', 'dead'))),
    archived AS (",
    archive!(
        "m g WHERE g.next IN ('succeeded', 'dead')",
        "g.next",
        "CASE WHEN g.next = 'dead' THEN g.error ELSE g.last_error END",
        "CASE WHEN g.next = 'succeeded' THEN g.worker END,
         CASE WHEN g.next = 'succeeded' THEN g.began END,
         CASE WHEN g.next = 'succeeded' THEN g.output END,
         CASE WHEN g.next = 'succeeded' THEN g.started_at END"
    ),
    "),
    -- A release leaves the job as before its claim (SPEC L4; attempts spent before a dead
    -- retry, max_attempts less budget, do not count): `retrying`, holding its
    -- group, when an earlier attempt counted (SPEC G2), else `ready`.
    kept AS (
        UPDATE {s}.jobs j
        SET state = CASE WHEN ($4::text[])[",
    at!(),
    "] = 'release'
                         AND j.attempts::int <= 1 + j.max_attempts - coalesce(j.budget, j.max_attempts)
                         THEN 'ready' ELSE 'retrying' END,
            run_at = CASE WHEN ($4::text[])[",
    at!(),
    "] = 'release' THEN j.run_at
                          WHEN ($6::timestamptz[])[",
    at!(),
    "] IS NOT NULL THEN GREATEST(($6::timestamptz[])[",
    at!(),
    "], now())
                          ELSE now() + ($5::bigint[])[",
    at!(),
    "]::float8 * interval '1 microsecond' END,
            attempts = CASE WHEN ($4::text[])[",
    at!(),
    "] = 'release' THEN j.attempts - 1 ELSE j.attempts END,
            last_error = CASE WHEN ($4::text[])[",
    at!(),
    "] = 'fail' THEN ($7::text[])[",
    at!(),
    "] ELSE j.last_error END,
            lease_token = NULL, lease_expires_at = NULL
        WHERE j.id = ANY (ARRAY(SELECT id FROM m WHERE next IN ('retrying', 'ready')))
          AND EXISTS (SELECT 1 FROM m WHERE next IN ('retrying', 'ready'))),
    logged AS (
        INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome,
                                  error, output, claimed_at)
        SELECT id, attempts, worker, began, now(),
               CASE kind WHEN 'complete' THEN 'succeeded' WHEN 'release' THEN 'released'
                         ELSE 'failed' END,
               error, output, started_at
        FROM m WHERE next <> 'succeeded'),",
    settle_tail!()
);

/// [`SETTLE`] for arrays of plain completions only, the common case: each lease's row
/// is deleted where [`SETTLE`] first locks it and then deletes it, which saves a row
/// lock (one WAL record) and a primary-key descent per job.
///
/// The `DELETE` checks each lease on the newest row version after a wait, as the lock
/// did, and only rows it deletes are locked. Its lease checks beyond id and token sit
/// inside a `CASE`, which the planner cannot match against the running index's
/// predicate: for the same reason as [`SETTLE`]'s `OFFSET 0`, rows are found by primary
/// key, not through the running index (`tests/postgres.rs` checks both plans).
///
/// **Lock order.** The rows are read through the primary key with the array as its
/// condition, which PostgreSQL sorts: so they are deleted in id order, as every other
/// writer locks job rows. On a table of a few pages the planner may read the table
/// sequentially instead, which deletes in its physical order. A batch cancel, which
/// locks the batch's jobs in id order, can then deadlock with a settle of two or more
/// running jobs of that batch: PostgreSQL aborts one after `deadlock_timeout` and both
/// run again ([`retry_transient`]), so the price is a delay in that race, never a lost
/// or doubled outcome.
const SETTLE_COMPLETES: &str = concat!(
    settle_inputs!(),
    "g AS (
        DELETE FROM {s}.jobs j
        WHERE j.id = ANY ($1::bigint[]) AND j.lease_token = ($2::uuid[])[",
    at!(),
    "]
          AND CASE WHEN j.state = 'running'
                   THEN j.queue = ($3::text[])[",
    at!(),
    "] AND j.lease_expires_at > now()
                   ELSE false END
        RETURNING j.*, 'succeeded'::text AS next, NULL::text AS fail_error,
                  ($8::text[])[",
    at!(),
    "] AS done_output,
                  LEAST(j.started_at + ($11::bigint[])[",
    at!(),
    "]::float8 * interval '1 microsecond', now()) AS began, ",
    at!(),
    "::bigint AS ord),
    archived AS (",
    archive!(
        "g",
        "g.next",
        "g.last_error",
        "g.worker, g.began, g.done_output, g.started_at"
    ),
    "),
    m AS (
        SELECT ord, next, NULL::timestamptz AS retry_at, queue, group_key, batch_id, stage
        FROM g),",
    settle_tail!()
);

/// One row of the settle statement, per lease it found current.
struct Row {
    ord: i64,
    next: String,
    retry_at: Option<DateTime<Utc>>,
    queue: String,
    group_key: Option<String>,
    batch_id: Option<i64>,
    stage: Option<i32>,
    /// The settle holds a witness for this row's batch: see [`SETTLE`].
    witnessed: bool,
    /// How many notifications the statement sent.
    notified: i64,
}

/// By position, in the order of the statement's final `SELECT` (see `Row` in claim.rs).
impl sqlx::FromRow<'_, PgRow> for Row {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            ord: row.try_get_unchecked(0)?,
            next: row.try_get_unchecked(1)?,
            retry_at: row.try_get_unchecked(2)?,
            queue: row.try_get_unchecked(3)?,
            group_key: row.try_get_unchecked(4)?,
            batch_id: row.try_get_unchecked(5)?,
            stage: row.try_get_unchecked(6)?,
            witnessed: row.try_get_unchecked(7)?,
            notified: row.try_get_unchecked(8)?,
        })
    }
}

/// The settles as the statement's array parameters.
#[derive(Default)]
struct Arrays<'a> {
    ids: Vec<i64>,
    tokens: Vec<uuid::Uuid>,
    queues: Vec<&'a str>,
    kinds: Vec<&'static str>,
    delays: Vec<Option<i64>>,
    retry_at: Vec<Option<DateTime<Utc>>>,
    errors: Vec<Option<&'a str>>,
    outputs: Vec<Option<&'a str>>,
    waited: Vec<i64>,
    /// Input index of each array element.
    index: Vec<usize>,
}

impl<'a> Arrays<'a> {
    fn push(&mut self, i: usize, s: &'a Settle) {
        let (kind, error, delay, at) = match &s.outcome {
            Outcome::Complete => ("complete", None, None, None),
            Outcome::Release => ("release", None, None, None),
            Outcome::Fail { error, retry } => {
                let (delay, at) = match *retry {
                    // Resolved against server time by the statement.
                    Retry::At(t) => (None, Some(t)),
                    Retry::Never => (None, None),
                    r => (r.delay(s.lease.attempt, Utc::now()).map(micros), None),
                };
                ("fail", Some(error.as_str()), delay, at)
            }
        };
        self.ids.push(s.lease.job.0);
        self.tokens.push(s.lease.token.0);
        self.queues.push(&s.lease.queue);
        self.kinds.push(kind);
        self.delays.push(delay);
        self.retry_at.push(at);
        self.errors.push(error);
        self.outputs.push(s.output.as_deref());
        self.waited.push(s.waited_micros());
        self.index.push(i);
    }
}

/// The settles in rounds of distinct jobs, each in id order: the statements find a
/// lease's inputs by binary search over the ids ([`at!`]). A lease given twice in one
/// call counts once; a job given again under another token goes to a later round, as
/// if the calls came one after another (at most one of its tokens is current).
/// Rows are locked in id order within a round, as every other writer locks them.
fn rounds(settles: &[Settle]) -> Vec<Vec<(usize, &Settle)>> {
    let mut seen = HashSet::new();
    let mut order: Vec<(usize, &Settle)> = settles
        .iter()
        .enumerate()
        .filter(|(_, s)| seen.insert((s.lease.job, s.lease.token)))
        .collect();
    order.sort_by_key(|(i, s)| (s.lease.job, *i));
    let mut rounds: Vec<Vec<(usize, &Settle)>> = Vec::new();
    let mut last = None;
    let mut round = 0;
    for (i, s) in order {
        round = if last == Some(s.lease.job) {
            round + 1
        } else {
            0
        };
        last = Some(s.lease.job);
        if rounds.len() <= round {
            rounds.push(Vec::new());
        }
        rounds[round].push((i, s));
    }
    rounds
}

impl PostgresBackend {
    async fn settle_tx(&self, settles: &[Settle]) -> Result<(Vec<Result<Settled>>, Vec<String>)> {
        let mut out: Vec<Result<Settled>> =
            settles.iter().map(|_| Err(Error::StaleLease)).collect();
        // Generic plans from the first run: see `GENERIC_BEGIN`.
        let mut tx = self
            .inner
            .pool
            .begin_with(GENERIC_BEGIN)
            .await
            .map_err(db)?;
        let (mut rows, mut notified) = (Vec::new(), 0);
        for round in rounds(settles) {
            let mut arrays = Arrays::default();
            for (i, s) in round {
                arrays.push(i, s);
            }
            let sql = if arrays.kinds.iter().all(|k| *k == "complete") {
                SETTLE_COMPLETES
            } else {
                SETTLE
            };
            let found: Vec<Row> = sqlx::query_as(self.sql(sql))
                .bind(&arrays.ids)
                .bind(&arrays.tokens)
                .bind(&arrays.queues)
                .bind(&arrays.kinds)
                .bind(&arrays.delays)
                .bind(&arrays.retry_at)
                .bind(&arrays.errors)
                .bind(&arrays.outputs)
                .bind(self.inner.schema.channel())
                .bind(format!("{}:", listen::FINISHED))
                .bind(&arrays.waited)
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?;
            // Each row carries the statement's count of notifications sent.
            notified += found.first().map_or(0, |r| r.notified);
            for row in found {
                let at = usize::try_from(row.ord - 1).map_err(Error::backend)?;
                rows.push((arrays.index[at], arrays.ids[at], row));
            }
        }
        let mut touched = Touched::default();
        let mut witnessed = Vec::new();
        for (i, id, row) in rows {
            let state: JobState = row.next.parse()?;
            out[i] = Ok(match state {
                JobState::Succeeded => Settled::Completed,
                JobState::Dead => Settled::Dead,
                JobState::Retrying => Settled::Retrying {
                    at: row
                        .retry_at
                        .ok_or_else(|| Error::backend("retrying job without a time"))?,
                },
                _ => Settled::Released,
            });
            touched.left(
                &row.queue,
                row.group_key.as_deref(),
                row.batch_id,
                row.stage,
                state,
            );
            touched.parent(id, row.batch_id, state);
            if row.witnessed {
                witnessed.extend(row.batch_id);
            }
        }
        touched.finished_notified(notified)?;
        for batch in witnessed {
            touched.witnessed(batch);
        }
        promote::promote(&mut tx, &self.inner.schema, &mut touched).await?;
        let payloads = touched.payloads();
        listen::send(&mut tx, &self.inner.schema.channel(), &touched.unsent()).await?;
        tx.commit().await.map_err(db)?;
        Ok((out, payloads))
    }
}

/// Begins a settle's transaction with generic plans for its statements (the settle,
/// the batch lock, the promotion and release, the `NOTIFY`), in the one round trip of
/// `BEGIN`; `SET LOCAL` ends with the transaction, so the session keeps its setting.
///
/// Why: PostgreSQL plans a prepared statement afresh for its first five runs on each
/// connection (about 1–2 ms each for these statements on the bench machine), and
/// every new pool connection starts over. A stage transition runs four of these
/// statements one after another, so on a fresh worker it paid that planning on its
/// critical path. The generic plans are the ones
/// `tests/postgres.rs` checks after `ANALYZE`, and the ones a warm connection switches
/// to once PostgreSQL judges them no costlier. `plan_cache_mode` needs PostgreSQL 12
/// or later.
pub(crate) const GENERIC_BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";

impl PostgresBackend {
    /// The plan PostgreSQL picks for the settle statement with two leases: the custom
    /// plan for these arrays, or, with `generic`, the generic plan a prepared statement
    /// may switch to after five executions. For checking that settles look their leases
    /// up by id on your data.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails.
    pub async fn explain_settle(&self, generic: bool) -> Result<String> {
        self.explain_settle_statement(SETTLE, generic).await
    }

    /// As [`explain_settle`](Self::explain_settle), for the statement that settles
    /// batches made only of plain completions.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails.
    pub async fn explain_settle_completions(&self, generic: bool) -> Result<String> {
        self.explain_settle_statement(SETTLE_COMPLETES, generic)
            .await
    }

    async fn explain_settle_statement(&self, sql: &'static str, generic: bool) -> Result<String> {
        self.explain(
            &self.sql(sql).0,
            "bigint[], uuid[], text[], text[], bigint[], timestamptz[], text[], text[], text, text, bigint[]",
            "'{1,2}',
             '{00000000-0000-0000-0000-000000000001,00000000-0000-0000-0000-000000000002}',
             '{q,q}', '{complete,complete}', '{NULL,NULL}', '{NULL,NULL}', '{NULL,NULL}',
             '{NULL,NULL}', 'c', 'f:', '{0,0}'",
            generic,
        )
        .await
    }
}

#[async_trait]
impl Complete for PostgresBackend {
    /// 512: each call is a transaction of its own (`BEGIN`, the statement, `COMMIT`: three
    /// round trips, then the pool's check on release) with a commit that waits for the
    /// WAL flush, a cost per call beyond its leases. With calls of at most 128, the
    /// outcomes of a draining worker's claims (about 130 jobs each) were often split
    /// across two calls, 1.3–1.4 per claim.
    fn preferred_settle_batch(&self) -> usize {
        512
    }

    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        if settles.is_empty() {
            return Ok(Vec::new());
        }
        let (out, payloads) =
            retry_transient(|| self.settle_tx(&settles), crate::retryable).await?;
        self.notify_local(&payloads);
        Ok(out)
    }

    /// The lease's checks beyond id and token sit inside a `CASE`, so the row is found
    /// by primary key: as plain conditions they matched the running index, which a
    /// table analyzed while nothing ran makes look empty, and a heartbeat then read
    /// every running entry, dead ones included (`tests/statistics.rs`).
    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        let until: Option<DateTime<Utc>> = sqlx::query_scalar(self.sql(
            "UPDATE {s}.jobs
             SET lease_expires_at = now() + $4::float8 * interval '1 microsecond'
             WHERE id = $1 AND lease_token = $2
               AND CASE WHEN state = 'running'
                        THEN queue = $3 AND lease_expires_at > now() ELSE false END
             RETURNING lease_expires_at",
        ))
        .bind(lease.job.0)
        .bind(lease.token.0)
        .bind(&lease.queue)
        .bind(micros(extend))
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        until.ok_or(Error::StaleLease)
    }

    /// Each job looked up by its primary key from the leases' side; finished jobs are in
    /// `finished`, so they are simply not found.
    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let ids: Vec<i64> = leases.iter().map(|l| l.job.0).collect();
        let tokens: Vec<uuid::Uuid> = leases.iter().map(|l| l.token.0).collect();
        let lost: Vec<i64> = sqlx::query_scalar(self.sql(LOST))
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(self.pool())
            .await
            .map_err(db)?;
        Ok(lost.into_iter().map(JobId).collect())
    }

    /// One statement, each job looked up by its primary key from the reports' side; a
    /// report's update touches no indexed column, so it is heap-only. The reports go
    /// in id order, the order every writer locks job rows in.
    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.beat(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let mut reports: Vec<&ProgressReport> = reports.iter().collect();
        reports.sort_unstable_by_key(|r| r.lease.job);
        let ids: Vec<i64> = reports.iter().map(|r| r.lease.job.0).collect();
        let tokens: Vec<uuid::Uuid> = reports.iter().map(|r| r.lease.token.0).collect();
        let stored: Vec<String> = reports.iter().map(|r| r.stored()).collect();
        let written: Vec<i64> = sqlx::query_scalar(self.sql(PROGRESS))
            .bind(&ids)
            .bind(&tokens)
            .bind(&stored)
            .fetch_all(self.pool())
            .await
            .map_err(db)?;
        Ok(ids
            .into_iter()
            .filter(|id| !written.contains(id))
            .map(JobId)
            .collect())
    }
}

/// SPEC L7: stores each report's progress `$3` on its job `$1` while the job is
/// `running` under token `$2`; returns the ids written.
pub(crate) const PROGRESS: &str = "UPDATE {s}.jobs j SET progress = r.progress
    FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS r(id, token, progress)
    WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
    RETURNING j.id";

/// SPEC B8: the leases `($1, $2)` whose job is not `running` under that token.
pub(crate) const LOST: &str =
    "SELECT DISTINCT l.id FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
    WHERE NOT EXISTS (SELECT 1 FROM {s}.jobs j
        WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running')";
