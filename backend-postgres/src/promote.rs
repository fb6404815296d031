//! Promotion: what finishing (or adding) jobs releases. Runs inside the caller's
//! transaction, so these invariants hold at every commit:
//!
//! - per (queue, group), at most one job is `ready`, `running` or `retrying`: the
//!   group's holder; the others are `blocked` (SPEC G1);
//! - the holder, when not yet started, is the group's earliest job (order key) whose
//!   stage is released (SPEC G2, G4);
//! - a batch job is `ready`, `running` or `retrying` only if no unfinished job of its
//!   batch has a lower stage (SPEC B2).
//!
//! Under READ COMMITTED, concurrent transactions would break them, so promotion is
//! serialized: per batch by its row lock, per group by an advisory transaction lock.
//! Transactions take the rows they finish first, then batches by id, then groups by
//! (queue, group), so two settles never deadlock on those. Promotion then updates other
//! jobs' rows (a released stage, a group's next holder); a transaction that cancels one
//! of exactly those rows while waiting for the same batch or group can still form a
//! cycle, which PostgreSQL breaks after `deadlock_timeout` and the loser runs again
//! (`retry_transient`). Claims take no promotion lock: they only turn `ready` into
//! `running`, which the group statements below allow for.

use std::collections::{BTreeMap, BTreeSet};

use relayq_core::{JobState, Result};
use sqlx::PgConnection;

use crate::{db, schema::Schema};

/// Moves the rows of CTE `$from` (aliased `g`, with every job column) into `finished`
/// with state `$state` and last error `$error` (SQL expressions); with `$attempt`, the
/// worker, start and output of the attempt that succeeded (three SQL expressions, NULL
/// when the job did not succeed), which then has no row in `attempts`.
macro_rules! archive {
    ($from:literal, $state:literal, $error:literal) => {
        archive!($from, $state, $error, "NULL, NULL, NULL, NULL")
    };
    ($from:literal, $state:literal, $error:literal, $attempt:literal) => {
        concat!(
            "INSERT INTO {s}.finished (id, queue, state, payload, priority, run_at, ",
            "max_attempts, attempts, group_key, batch_id, stage, dedupe_key, enqueued_by, ",
            "created_at, last_error, finished_at, progress, budget, worker, started_at, output, ",
            "claimed_at, limit_key) ",
            "SELECT g.id, g.queue, ",
            $state,
            ", g.payload, g.priority, g.run_at, g.max_attempts, g.attempts, g.group_key, ",
            "g.batch_id, g.stage, g.dedupe_key, g.enqueued_by, g.created_at, ",
            $error,
            ", now(), g.progress, g.budget, ",
            $attempt,
            ", g.limit_key FROM ",
            $from
        )
    };
}
pub(crate) use archive;

/// What a transaction changed that promotion must look at, and whom to notify.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    /// Batches that had a job finish, or join above the released stage: their next
    /// stage may be released.
    batches: BTreeSet<i64>,
    /// Halt-on-failure candidates: batch → lowest stage with a dead job.
    halts: BTreeMap<i64, i32>,
    /// Groups whose holder may change.
    groups: BTreeSet<(String, String)>,
    /// Queues where jobs became claimable.
    pub(crate) ready: BTreeSet<String>,
    /// Queues where jobs finished, for batch waiters.
    pub(crate) finished: BTreeSet<String>,
    /// Queues where running jobs may have lost their leases to a cancel (SPEC B8).
    pub(crate) revoked: BTreeSet<String>,
    /// Finished jobs of a batch (id, batch, how they ended), for the jobs that run
    /// after them (SPEC D).
    parents: Vec<(i64, i64, JobState)>,
    /// Notifications already sent in this transaction: by the settle statement, with
    /// the batches' lock, or by `settle_groups`. So a `Touched` belongs to one
    /// transaction: reused in another, it would hold back notifications that
    /// transaction never sent.
    sent: BTreeSet<String>,
}

impl Touched {
    /// A job of `queue` left `running` for `state` (a finished state, or `ready` when
    /// released).
    pub(crate) fn left(
        &mut self,
        queue: &str,
        group: Option<&str>,
        batch: Option<i64>,
        stage: Option<i32>,
        state: JobState,
    ) {
        match state {
            JobState::Ready => {
                self.ready.insert(queue.to_owned());
                if let Some(group) = group {
                    self.group(queue, group);
                }
            }
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                if let Some(group) = group {
                    self.group(queue, group);
                }
                if let Some(batch) = batch {
                    self.batches.insert(batch);
                    self.finished.insert(queue.to_owned());
                    if let (JobState::Dead, Some(stage)) = (state, stage) {
                        let low = self.halts.entry(batch).or_insert(stage);
                        *low = (*low).min(stage);
                    }
                }
            }
            _ => {}
        }
    }

    /// Job `id` of `batch` finished in `state`: its children are counted off or
    /// cancelled (SPEC D2, D4). Every way a job of a batch finishes calls this.
    pub(crate) fn parent(&mut self, id: i64, batch: Option<i64>, state: JobState) {
        if let (Some(batch), true) = (batch, state.is_finished()) {
            self.parents.push((id, batch, state));
        }
    }

    /// A job was added to (or revived in) `group`.
    pub(crate) fn group(&mut self, queue: &str, group: &str) {
        self.groups.insert((queue.to_owned(), group.to_owned()));
    }

    /// A job was added to `batch` above its released stage (or before any).
    pub(crate) fn batch(&mut self, batch: i64) {
        self.batches.insert(batch);
    }

    /// The settle statement holds a witness for `batch` (see `settle::SETTLE`): what it
    /// finished cannot release a stage, so promotion neither locks the batch nor looks
    /// for a stage to release. Never for a batch where a job died: a halt (SPEC B6)
    /// needs the lock before its statement.
    pub(crate) fn witnessed(&mut self, batch: i64) {
        if !self.halts.contains_key(&batch) {
            self.batches.remove(&batch);
        }
    }

    /// The statement that finished the jobs sent the `finished` notification of every
    /// queue in [`finished`](Self::finished), `sent` of them: checks the count and
    /// records them as sent.
    pub(crate) fn finished_notified(&mut self, sent: i64) -> Result<()> {
        if usize::try_from(sent).ok() != Some(self.finished.len()) {
            return Err(relayq_core::Error::backend(
                "the settle did not send its notifications",
            ));
        }
        let done = crate::listen::payloads([], self.finished.iter().map(String::as_str));
        self.sent.extend(done);
        Ok(())
    }

    /// Every notification of the transaction: see [`crate::listen::payloads`].
    pub(crate) fn payloads(&self) -> Vec<String> {
        let mut all = crate::listen::payloads(
            self.ready.iter().map(String::as_str),
            self.finished.iter().map(String::as_str),
        );
        all.extend(
            self.revoked
                .iter()
                .map(|q| relayq_core::kit::wake::revoked(q)),
        );
        all
    }

    /// The notifications still to send: [`payloads`](Self::payloads) less those sent
    /// already (see `sent`).
    pub(crate) fn unsent(&self) -> Vec<String> {
        let mut all = self.payloads();
        all.retain(|p| !self.sent.contains(p));
        all
    }
}

/// A locked batch: id, queue, sealed, failed, released stage.
pub(crate) type LockedBatch = (i64, String, bool, bool, Option<i32>);

/// Locks `batches` (by id) for the rest of the transaction; returns those that exist.
///
/// The same round trip sends `notify` on the schema's channel. A notification is
/// delivered at commit wherever in the transaction it was sent, and this takes a
/// round trip off every settle that finishes batch jobs, one of those it makes while
/// holding the batches' lock.
pub(crate) async fn lock_batches(
    c: &mut PgConnection,
    s: &Schema,
    batches: &[i64],
    notify: &[String],
) -> Result<Vec<LockedBatch>> {
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    // Rows are locked after the sort, so in id order. `note` is the outer side of the
    // join, so it runs (one row) even when no batch exists.
    let rows: Vec<(i64, Option<LockedBatch>)> = sqlx::query_as(s.sql(
        "WITH locked AS MATERIALIZED (
                 SELECT id, queue, sealed, failed, released_stage FROM {s}.batches
                 WHERE id = ANY($1) ORDER BY id FOR UPDATE),
             note AS MATERIALIZED (
                 SELECT count(pg_notify($2, p)) AS n FROM unnest($3::text[]) AS p)
             SELECT note.n,
                    CASE WHEN l.id IS NOT NULL
                         THEN (l.id, l.queue, l.sealed, l.failed, l.released_stage) END
             FROM note LEFT JOIN locked l ON true",
    ))
    .bind(batches)
    .bind(s.channel())
    .bind(notify)
    .fetch_all(c)
    .await
    .map_err(db)?;
    if rows.first().map(|r| r.0) != Some(i64::try_from(notify.len()).unwrap_or(i64::MAX)) {
        return Err(relayq_core::Error::backend(
            "locking batches did not send its notifications",
        ));
    }
    Ok(rows.into_iter().filter_map(|(_, batch)| batch).collect())
}

/// Applies what `t` implies: `Halt` batches with a dead job fail and cancel their later
/// stages (SPEC B6), batches release their next stage (SPEC B2), and groups get their
/// next holder (SPEC G2). Adds the queues to notify to `t`.
pub(crate) async fn promote(c: &mut PgConnection, s: &Schema, t: &mut Touched) -> Result<()> {
    let parents = std::mem::take(&mut t.parents);
    let mut batches = t.batches.clone();
    // SPEC D: a batch whose finished job has children is locked even where a witness
    // spared its lock, before its children are counted off (see `after`). A statement
    // of its own, begun after the settle's: so it sees an edge whose enqueue the
    // settle waited for.
    let kin = if parents.is_empty() {
        Vec::new()
    } else {
        let ids: Vec<(i64, i64)> = parents.iter().map(|p| (p.0, p.1)).collect();
        crate::after::batches_with_children(c, s, &ids).await?
    };
    batches.extend(kin.iter().copied());
    let batches: Vec<i64> = batches.into_iter().collect();
    let halting = if t.halts.is_empty() {
        Vec::new()
    } else {
        lock_halted(c, s, t).await?
    };
    if !batches.is_empty() {
        let notify = t.unsent();
        lock_batches(c, s, &batches, &notify).await?;
        t.sent.extend(notify);
    }
    if !halting.is_empty() {
        halt(c, s, t, &halting).await?;
    }
    if !kin.is_empty() {
        crate::after::settle(c, s, t, &parents).await?;
    }
    if !batches.is_empty() {
        let released: Vec<(String, String, Option<String>)> = sqlx::query_as(s.sql(RELEASE))
            .bind(&batches)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        for (kind, queue, group) in released {
            match (kind.as_str(), group) {
                ("g", Some(group)) => t.group(&queue, &group),
                _ => {
                    t.ready.insert(queue);
                }
            }
        }
    }
    if !t.groups.is_empty() {
        settle_groups(c, s, t).await?;
    }
    Ok(())
}

/// The `Halt` batches a dead job halts now, with the lowest stage of a dead job each;
/// their unfinished jobs are locked, in id order, before the batches' lock (SPEC B6).
///
/// Why first: a settle locks its jobs, then the batches. The halt cancels the batch's
/// running jobs too, and locking their rows after the batch's would always wait for a
/// sibling's settle that waits for the batch: a deadlock. Locked here, a sibling's
/// settle that holds its row is waited for and finishes first (its row is gone then,
/// and skipped).
///
/// Not every deadlock is gone: this transaction already holds its own jobs' rows, so
/// two jobs of one batch dying in two transactions at once, or a `cancel_batch` (which
/// locks the batch's rows in id order) meeting a death, can each wait for the other.
/// PostgreSQL breaks that after `deadlock_timeout` and the loser's call is retried
/// (`retry_transient`): a stall of about a second, rare, and nothing lost.
///
/// Planned for its parameters from here on: a settle's transaction forces generic
/// plans ([`GENERIC_BEGIN`](crate::settle::GENERIC_BEGIN)), and the halt's generic
/// plan, not knowing how many jobs a batch has, hash-joins a scan of every batch job
/// once the table holds many. Halts are rare, so the extra round trips are too; the
/// statements after them in the same transaction are then planned for their
/// parameters as well, which costs only planning time.
async fn lock_halted(c: &mut PgConnection, s: &Schema, t: &Touched) -> Result<Vec<(i64, i32)>> {
    let (batches, stages): (Vec<i64>, Vec<i32>) = t.halts.iter().map(|(b, s)| (*b, *s)).unzip();
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
        .execute(&mut *c)
        .await
        .map_err(db)?;
    // By primary key: a `Continue` batch, or one halted already, stops here.
    let halting: Vec<(i64, i32)> = sqlx::query_as(s.sql(
        "SELECT b.id, h.stage FROM unnest($1::bigint[], $2::int[]) AS h(batch, stage)
         JOIN {s}.batches b ON b.id = h.batch
         WHERE b.on_failure = 'halt' AND NOT b.failed",
    ))
    .bind(&batches)
    .bind(&stages)
    .fetch_all(&mut *c)
    .await
    .map_err(db)?;
    if halting.is_empty() {
        return Ok(halting);
    }
    let ids: Vec<i64> = halting.iter().map(|h| h.0).collect();
    sqlx::query(s.sql("SELECT id FROM {s}.jobs WHERE batch_id = ANY($1) ORDER BY id FOR UPDATE"))
        .bind(&ids)
        .execute(c)
        .await
        .map_err(db)?;
    Ok(halting)
}

/// SPEC B6, B8: in a `Halt` batch, a dead job fails the batch and cancels every other
/// unfinished job: later stages (not started) and its own stage's, running ones
/// included, whose attempts are logged as cancelled. Their groups get their next
/// holder, and workers running them hear of it (`c:<queue>`).
async fn halt(
    c: &mut PgConnection,
    s: &Schema,
    t: &mut Touched,
    halting: &[(i64, i32)],
) -> Result<()> {
    let (batches, stages): (Vec<i64>, Vec<i32>) = halting.iter().copied().unzip();
    let cancelled: Vec<(String, Option<String>, bool)> = sqlx::query_as(s.sql(concat!(
        "WITH h AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS h(batch, stage)),
         failed AS (
             UPDATE {s}.batches b SET failed = true FROM h
             WHERE b.id = h.batch AND b.on_failure = 'halt'
             RETURNING b.id, h.stage),
         g AS (
             DELETE FROM {s}.jobs j USING failed f
             WHERE j.batch_id = f.id AND j.stage >= f.stage
             RETURNING j.*),
         logged AS (
             INSERT INTO {s}.attempts
                 (job_id, attempt, worker, started_at, ended_at, outcome, error, claimed_at)
             SELECT id, attempts, worker, started_at, now(), 'cancelled', $3, started_at
             FROM g WHERE state = 'running'),
         archived AS (",
        archive!("g", "'cancelled'", "g.last_error"),
        ")
         SELECT DISTINCT queue, group_key, state = 'running' FROM g"
    )))
    .bind(&batches)
    .bind(&stages)
    .bind(relayq_core::cancelled_by::HALT)
    .fetch_all(c)
    .await
    .map_err(db)?;
    for (queue, group, running) in cancelled {
        if let Some(group) = group {
            t.group(&queue, &group);
        }
        if running {
            t.revoked.insert(queue);
        }
    }
    Ok(())
}

/// Releases each batch's lowest unfinished stage (every row of `jobs` is unfinished):
/// raises the high-water mark, makes its ungrouped jobs ready (rows `r`, queue) and
/// names its groups (rows `g`, queue, group), which then pick their holder.
///
/// A batch whose floor is its released stage already has nothing to release, and its
/// floor stage is not read: no ungrouped job there is `blocked` (the release freed
/// them, and jobs joining that stage are stored `ready`), and its grouped jobs are
/// their groups' business. Reading it anyway made each enqueue into a released stage
/// cost as much as the stage held, so filling a stage in chunks took quadratic time.
///
/// The floor stage's blocked jobs are read once, per batch, in a `LATERAL` subquery
/// from `b` with no condition on the group: so the only index that fits is the stage
/// index, probed per batch. Joined the plain way, `jobs` was read in full on every
/// release (no index covers `batch_id` without the stage index's `IS NOT NULL`), and
/// with a group condition the planner could walk every grouped job instead
/// (`tests/postgres.rs` checks both plans).
const RELEASE: &str = "
    WITH b AS MATERIALIZED (
        SELECT b.id, (SELECT min(j.stage) FROM {s}.jobs j WHERE j.batch_id = b.id) AS floor,
               x.released_stage AS was
        FROM unnest($1::bigint[]) AS b(id) JOIN {s}.batches x ON x.id = b.id),
    raised AS (
        UPDATE {s}.batches x SET released_stage = b.floor FROM b
        WHERE x.id = b.id AND b.floor IS NOT NULL
          AND (x.released_stage IS NULL OR x.released_stage < b.floor)),
    blocked AS MATERIALIZED (
        SELECT x.id, x.queue, x.group_key
        FROM (SELECT * FROM b WHERE b.was IS NULL OR b.was < b.floor) b CROSS JOIN LATERAL (
            SELECT x.id, x.queue, x.group_key FROM {s}.jobs x
            WHERE x.batch_id = b.id AND x.stage = b.floor AND x.state = 'blocked'
            OFFSET 0) x),
    freed AS (
        UPDATE {s}.jobs j SET state = 'ready'
        WHERE j.id = ANY (ARRAY(SELECT id FROM blocked WHERE group_key IS NULL))
          AND j.state = 'blocked' AND j.deps_left = 0
          AND EXISTS (SELECT 1 FROM blocked WHERE group_key IS NULL)
        RETURNING j.queue)
    SELECT DISTINCT 'r' AS kind, queue, NULL::text AS grp FROM freed
    UNION
    SELECT DISTINCT 'g', queue, group_key FROM blocked WHERE group_key IS NOT NULL";

impl crate::PostgresBackend {
    /// The plan PostgreSQL picks for promotion's stage release of two batches: the
    /// custom plan, or with `generic` the generic plan a prepared statement may switch
    /// to after five executions. For checking that it reads `jobs` one batch at a
    /// time, on your data.
    ///
    /// # Errors
    /// [`relayq_core::Error::Backend`] when the server fails.
    pub async fn explain_release(&self, generic: bool) -> Result<String> {
        let sql = self.sql(RELEASE).0;
        self.explain(&sql, "bigint[]", "'{1,2}'", generic).await
    }
}

/// Per touched (queue, group): whether a job of it is running or retrying, and its head
/// (earliest job whose stage is released); demotes every other `ready` job of it. Both
/// questions go to `jobs_holder`, which holds only a group's live jobs.
const HEADS: &str = "
    WITH g AS (SELECT * FROM unnest($1::text[], $2::text[]) AS g(queue, grp)),
     st AS MATERIALIZED (
         SELECT g.queue, g.grp,
             EXISTS (SELECT 1 FROM {s}.jobs b
                     WHERE b.queue = g.queue AND b.group_key = g.grp
                       AND b.state IN ('running', 'retrying')) AS busy,
             (SELECT j.id FROM {s}.jobs j
              WHERE j.queue = g.queue AND j.group_key = g.grp
                AND j.state IN ('ready', 'blocked') AND j.deps_left = 0
                AND (j.batch_id IS NULL OR j.stage <= (
                     SELECT min(f.stage) FROM {s}.jobs f WHERE f.batch_id = j.batch_id))
              ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS head
         FROM g),
     demoted AS (
         UPDATE {s}.jobs j SET state = 'blocked' FROM st
         WHERE NOT st.busy AND j.queue = st.queue AND j.group_key = st.grp
           AND j.state = 'ready' AND j.id IS DISTINCT FROM st.head)
     SELECT array_agg(head) FROM st WHERE NOT busy AND head IS NOT NULL";

/// Promotes the heads found, where no job of the group is running or retrying (again
/// through `jobs_holder`).
const PROMOTE: &str = "
     UPDATE {s}.jobs j SET state = 'ready'
     WHERE j.id = ANY($1) AND j.state = 'blocked'
       AND NOT EXISTS (SELECT 1 FROM {s}.jobs b
                       WHERE b.queue = j.queue AND b.group_key = j.group_key
                         AND b.state IN ('running', 'retrying'))
     RETURNING j.queue";

impl crate::PostgresBackend {
    /// The plans PostgreSQL picks for the statements that give two groups their next
    /// holder (custom, or with `generic` the generic plan): the head look-up with its
    /// demotion, then the promotion. For checking on your data that they ask the
    /// holder index, not every job of the group.
    ///
    /// # Errors
    /// [`relayq_core::Error::Backend`] when the server fails.
    pub async fn explain_group_holders(&self, generic: bool) -> Result<(String, String)> {
        let heads = self.sql(HEADS).0;
        let heads = self
            .explain(&heads, "text[], text[]", "'{q,q}', '{a,b}'", generic)
            .await?;
        let promote = self.sql(PROMOTE).0;
        let promote = self
            .explain(&promote, "bigint[]", "'{1,2}'", generic)
            .await?;
        Ok((heads, promote))
    }
}

/// Makes each touched group's holder right, under the groups' advisory locks, in one
/// call of `settle_groups` (migration 0005), which also sends the transaction's
/// notifications so far and those of the promoted heads' queues.
///
/// The order matters under concurrent claims: first demote every `ready` job that is
/// not the head ([`HEADS`]: this waits for a claim holding one, and skips it once it
/// runs), then, in a new statement and so a new snapshot, promote the head only if no
/// job of the group is running or retrying ([`PROMOTE`]). Checking first and demoting
/// after would let a claim in between leave two live jobs in one group. The function
/// runs them as two statements, each with its own snapshot.
///
/// One call, not four statements: the locks, the look-up, the promotion and the
/// `NOTIFY` each cost a round trip, and all four were made while holding the groups'
/// locks, so a group's next job waited for them.
async fn settle_groups(c: &mut PgConnection, s: &Schema, t: &mut Touched) -> Result<()> {
    // Locked in this order, (queue, group), as every transaction locks groups.
    let keys: Vec<String> = t
        .groups
        .iter()
        .map(|(q, g)| format!("{}\u{1f}{q}\u{1f}{g}", s.name()))
        .collect();
    let (queues, groups): (Vec<&str>, Vec<&str>) = t
        .groups
        .iter()
        .map(|(q, g)| (q.as_str(), g.as_str()))
        .unzip();
    let promoted: Option<Vec<String>> =
        sqlx::query_scalar(s.sql("SELECT {s}.settle_groups($1, $2, $3, $4, $5, $6)"))
            .bind(&queues)
            .bind(&groups)
            .bind(&keys)
            .bind(s.channel())
            .bind(t.unsent())
            .bind(format!("{}:", crate::listen::READY))
            .fetch_one(&mut *c)
            .await
            .map_err(db)?;
    t.ready.extend(promoted.unwrap_or_default());
    // The call sent what was unsent and the promoted queues' ready notifications:
    // every payload `t` holds now.
    let all = t.payloads();
    t.sent.extend(all);
    Ok(())
}

#[cfg(test)]
mod tests {
    use relayq_conformance::harness::{Server, server_url};

    use super::*;
    use crate::{Config, PostgresBackend};

    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// `settle_groups` (migration 0005) runs [`HEADS`] and [`PROMOTE`] word for word
    /// (the promotion with `heads` for `$1`), after the groups' locks and in that order,
    /// each a statement of its own: so the plans `explain_group_holders` shows (and
    /// `tests/postgres.rs` checks) are the plans of the statements that run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        relayq_no_postgres,
        ignore = "no postgres server: RELAYQ_POSTGRES_URL unset"
    )]
    async fn settle_groups_runs_the_explained_statements() {
        let url = server_url(Server::of(&crate::DRIVER))
            .await
            .expect("RELAYQ_POSTGRES_URL");
        let schema = crate::test_schema::fresh("groupfn");
        let b = PostgresBackend::connect_with(&url, Config::default().with_schema(schema.clone()))
            .await
            .unwrap();
        b.migrate().await.unwrap();
        let body: Option<String> =
            sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)")
                .bind(format!(
                    "\"{schema}\".settle_groups(text[], text[], text[], text, text[], text)"
                ))
                .fetch_one(b.pool())
                .await
                .unwrap();
        crate::test_schema::drop(b.pool(), &schema).await;
        let body = words(&body.expect("settle_groups exists"));
        let s = Schema::new(&schema).unwrap();
        let steps = [
            "PERFORM count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM unnest(keys) AS k;"
                .to_owned(),
            format!("; {} INTO heads;", words(&s.sql(HEADS).0)),
            format!(
                "WITH p AS ( {}) SELECT",
                words(&s.sql(PROMOTE).0).replace("ANY($1)", "ANY(heads)")
            ),
        ];
        let at: Vec<Option<usize>> = steps.iter().map(|step| body.find(step.as_str())).collect();
        assert!(
            at.iter().all(Option::is_some) && at.is_sorted(),
            "steps at {at:?}:\n{steps:#?}\nfunction:\n{body}"
        );
    }
}
