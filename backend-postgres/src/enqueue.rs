//! SPEC E: storing jobs, set-based, optionally in the caller's transaction.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    BatchId, Enqueue, Enqueued, Error, JobId, Limits, NewJob, Result, RunAt,
    retry::retry_transient, validate,
};
use sqlx::{Connection, PgConnection};

use crate::{
    PostgresBackend, db, listen, micros,
    promote::{self, Touched},
};

// The insert of `INSERT` and `INSERT_QUIET`.
macro_rules! insert_jobs {
    () => {
        "
    WITH ins AS (
        INSERT INTO {s}.jobs (queue, state, payload, priority, run_at, max_attempts, group_key,
                              batch_id, stage, dedupe_key, enqueued_by, created_at, limit_key)
        SELECT $1,
               CASE WHEN i.grp IS NULL AND (i.batch IS NULL OR i.stage <= i.released)
                    THEN 'ready' ELSE 'blocked' END,
               i.payload, i.priority,
               CASE WHEN i.run_at IS NOT NULL THEN i.run_at
                    ELSE now() + COALESCE(i.delay_us, 0)::float8 * interval '1 microsecond'
               END,
               i.max_attempts, i.grp, i.batch, i.stage, i.dedupe, i.who, now(), i.lkey
        FROM unnest($2::bytea[], $3::smallint[], $4::timestamptz[], $5::bigint[],
                    $6::smallint[], $7::text[], $8::bigint[], $9::int[], $10::text[],
                    $11::text[], $14::int[], $15::text[])
            WITH ORDINALITY AS i(payload, priority, run_at, delay_us, max_attempts, grp,
                                 batch, stage, dedupe, who, released, lkey, ord)
        ORDER BY i.ord
        ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING id, dedupe_key)"
    };
}

/// SPEC K4: parks each new job (ids `$2`) of a key whose limit is at most 64 that has
/// a parked job of its key ahead of it, or 64 due, waiting, unparked ones. Either way
/// something puts it back: each unparked job ahead puts one parked job of the key back
/// when it leaves (a claim and its end, a cancel, a demotion: migration 0012's
/// `key_freed`), and whatever puts back a parked job ahead goes on to the jobs behind
/// it. So claims never read a long backlog of one key. Jobs not yet due are not
/// counted: one of them ahead would hold a due job back. A key with fewer waiting is
/// left to the claim's parking, which a short backlog costs little: parking every job
/// beyond the limit sent each through a settle's unpark. The statement reads the table
/// as it was before it, and a key's first new jobs are never parked, so each parked job
/// keeps what was counted ahead. The latest parked job ahead is one step down
/// `jobs_parked`; the count reads at most 64 entries of `jobs_key_waiting` (migration
/// 0015), and only for a key with nothing parked ahead. The new jobs are found by
/// primary key: their state is tested as `<>`, which no partial index's predicate
/// follows from (with `IN`, after `ANALYZE` of an empty table the planner read them
/// through the claim index).
pub(crate) const PARK_NEW: &str = "UPDATE {s}.jobs j SET parked = true
    WHERE j.id = ANY($2) AND j.limit_key IS NOT NULL
      AND j.state <> 'blocked' AND j.state <> 'running' AND j.run_at <= now()
      AND COALESCE((SELECT max FROM {s}.key_limits
                    WHERE queue = $1 AND limit_key = j.limit_key),
                   (SELECT key_limit FROM {s}.queues WHERE queue = $1)) <= 64
      AND CASE WHEN EXISTS (
               SELECT 1 FROM {s}.jobs p
               WHERE p.queue = $1 AND p.limit_key = j.limit_key AND p.parked
                 AND p.state IN ('ready', 'retrying')
                 AND (p.priority, p.run_at, p.id) < (j.priority, j.run_at, j.id)
               ORDER BY p.priority DESC, p.run_at DESC, p.id DESC LIMIT 1)
          THEN true
          ELSE (SELECT count(*) FROM (
               SELECT 1 FROM {s}.jobs a
               WHERE a.queue = $1 AND a.limit_key = j.limit_key
                 AND a.state IN ('ready', 'retrying') AND NOT a.parked
                 AND a.limit_key IS NOT NULL AND a.run_at <= now()
                 AND (a.priority, a.run_at, a.id) < (j.priority, j.run_at, j.id)
               LIMIT 64) ahead) = 64 END";

/// Inserts the jobs given as arrays, in input order (so their ids increase in that
/// order), skipping those whose dedupe key an unfinished job holds (SPEC E3), and
/// notifies the queue. A job without a group is `ready` at once when it has no batch or
/// its stage is its batch's released one (`released`, NULL when none is): nothing below
/// that stage is unfinished (SPEC B3 turns lower ones away). Other jobs with a group or
/// a batch start `blocked`; promotion decides.
const INSERT: &str = concat!(
    insert_jobs!(),
    ",
    note AS (SELECT pg_notify($12, $13))
    SELECT ins.id, ins.dedupe_key FROM ins LEFT JOIN note ON true"
);

/// [`INSERT`] without the notification, for a plain enqueue outside the caller's
/// transaction: that one is sent after the commit (see [`listen::send_after_commit`]).
/// `$12` and `$13` are bound and unused (their types come with the arguments), so both
/// statements take the same ones.
const INSERT_QUIET: &str = concat!(insert_jobs!(), "\n    SELECT id, dedupe_key FROM ins");

/// How many times a dedupe key can be found taken and then free again within one call
/// (its holder finished in between) before the call gives up.
const DEDUPE_ROUNDS: usize = 3;

/// Each batch of an enqueue, locked: its released stage, if any.
type Released = HashMap<i64, Option<i32>>;

/// Whether `job` joins its batch above the released stage (or before any is): only
/// then can it move the batch's floor, and promotion must look at the batch. A job at
/// the released stage is stored `ready` (or is its group's business).
fn above_released(job: &NewJob, released: &Released) -> bool {
    job.batch.is_some_and(|b| {
        released
            .get(&b.0)
            .copied()
            .flatten()
            .is_none_or(|r| job.stage.unwrap_or(0) > r)
    })
}

impl PostgresBackend {
    /// Stores `jobs` within the transaction open on `conn` (a `&mut Transaction`
    /// derefs to one): they are visible, claimable and announced to workers only if
    /// that transaction commits, and vanish if it rolls back. Behaves as
    /// [`Enqueue::enqueue`] otherwise; an error rolls back only what this call wrote
    /// (it runs in a savepoint), so the caller's transaction stays usable.
    ///
    /// ```no_run
    /// # async fn f(backend: relayq_postgres::PostgresBackend) -> Result<(), Box<dyn std::error::Error>> {
    /// use relayq_core::NewJob;
    ///
    /// let mut tx = backend.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// backend.enqueue_in(&mut tx, vec![NewJob::new("mail", b"order 42".to_vec())]).await?;
    /// tx.commit().await?; // the order and its job, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// Jobs with a group, a batch or a dedupe key need the transaction at READ
    /// COMMITTED (PostgreSQL's default): their checks must see what other transactions
    /// committed after this one began, which REPEATABLE READ and SERIALIZABLE hide. Such
    /// jobs also lock their batches and groups until the caller commits, holding up
    /// workers finishing jobs of those batches and groups: keep the transaction short.
    ///
    /// Jobs with a limit key are not set aside here behind a long backlog of their key,
    /// as [`Enqueue::enqueue`] sets those without a group or batch aside (SPEC K4): that
    /// takes the queue's lock, which would hold its claims until the caller commits.
    /// Claims set them aside.
    ///
    /// # Errors
    /// As [`Enqueue::enqueue`]; [`Error::InvalidInput`] on `transaction` for jobs with a
    /// group, batch or dedupe key in a transaction above READ COMMITTED.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<Enqueued>> {
        // Outside the traits, so core's public methods do not check this call's input.
        validate::new_jobs(&jobs, &Enqueue::limits(self))?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        if !all_plain(&jobs) {
            let level: String =
                sqlx::query_scalar("SELECT current_setting('transaction_isolation')")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db)?;
            if level != "read committed" {
                return Err(Error::invalid(
                    "transaction",
                    format!(
                        "jobs with a group, batch or dedupe key need a READ COMMITTED transaction, this one is {}",
                        level.to_uppercase()
                    ),
                ));
            }
        }
        let mut tx = conn.begin().await.map_err(db)?;
        let (out, _) = self.enqueue_on(&mut tx, &jobs).await?;
        tx.commit().await.map_err(db)?;
        Ok(out)
    }

    /// Plain jobs (see [`all_plain`]) on `c`, outside any transaction but that of their
    /// parking: one statement, atomic on its own, which notifies no one. The caller
    /// sends the queue's wake-up after the commit ([`listen::send_after_commit`]).
    async fn insert_plain(&self, c: &mut PgConnection, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        self.insert(c, &jobs[0].queue, jobs, &Released::new(), INSERT_QUIET)
            .await
    }

    async fn enqueue_tx(&self, jobs: &[NewJob]) -> Result<(Vec<Enqueued>, Vec<String>)> {
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let out = self.enqueue_on(&mut tx, jobs).await?;
        // Not with batches or groups: their locks, taken above, come after the queue
        // row's in a settle (the `key_freed` trigger, then promotion), and the two
        // orders would deadlock. Claims park those jobs.
        if jobs.iter().all(|j| j.group.is_none() && j.batch.is_none()) {
            self.park_new(&mut tx, jobs, &out.0).await?;
        }
        tx.commit().await.map_err(db)?;
        Ok(out)
    }

    /// SPEC K4: in relayq's own enqueue transaction, just before its commit, parks the
    /// new jobs that have 64 of their key's due waiting jobs, or a parked one, ahead
    /// ([`PARK_NEW`]).
    /// Under the queue row's lock, taken `FOR UPDATE` as a keyed claim takes it: a
    /// settle or cancel that frees a slot of the key or passes its turn on takes it
    /// `FOR KEY SHARE` (migration 0012's `key_freed`), so it either committed before
    /// the count (which then does not count its job) or waits for this commit (and then
    /// sees the parked job it may put back). Not in [`Self::enqueue_in`]: the lock
    /// would hold the queue's keyed claims until the caller commits, so jobs enqueued
    /// there are left to the claim's parking.
    async fn park_new(
        &self,
        c: &mut PgConnection,
        jobs: &[NewJob],
        out: &[Enqueued],
    ) -> Result<()> {
        let new = relayq_core::kit::keys::new_keyed_ids(jobs, out);
        let Some(first) = jobs.first().filter(|_| !new.is_empty()) else {
            return Ok(());
        };
        // Unlocked first: a queue without key limits is not locked at all. One that
        // gains them meanwhile is left to its claims' parking.
        let keyed: Option<bool> =
            sqlx::query_scalar(self.sql("SELECT keyed FROM {s}.queues WHERE queue = $1"))
                .bind(&first.queue)
                .fetch_optional(&mut *c)
                .await
                .map_err(db)?;
        if keyed != Some(true) {
            return Ok(());
        }
        sqlx::query(self.sql("SELECT 1 FROM {s}.queues WHERE queue = $1 FOR UPDATE"))
            .bind(&first.queue)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        // Planned at each call: a plan cached while the table was small counted through
        // the claim index (every waiting job of the queue ahead, filtered by key) and a
        // 10,000-key enqueue of 50,000 jobs took minutes.
        sqlx::query(self.sql(PARK_NEW))
            .persistent(false)
            .bind(&first.queue)
            .bind(&new)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// The whole enqueue inside the transaction on `c`.
    pub(crate) async fn enqueue_on(
        &self,
        c: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<(Vec<Enqueued>, Vec<String>)> {
        let queue = &jobs[0].queue;
        // SPEC D: the stored parents are locked before the batches (see `after`).
        let parents = crate::after::parents(c, &self.inner.schema, queue, jobs).await?;
        let released = self.check_batches(c, queue, jobs, &parents).await?;
        let out = self.insert(c, queue, jobs, &released, INSERT).await?;
        let mut touched = Touched::default();
        if jobs.iter().any(|j| !j.after.is_empty()) {
            let policies = self.after_policies(c, jobs).await?;
            let s = &self.inner.schema;
            crate::after::store(c, s, jobs, &out, &parents, &policies, &mut touched).await?;
        }
        touched.ready.insert(queue.clone());
        for (job, e) in jobs.iter().zip(&out) {
            if e.deduplicated {
                continue;
            }
            if let Some(group) = &job.group {
                touched.group(queue, group);
            }
            if let (Some(batch), true) = (job.batch, above_released(job, &released)) {
                touched.batch(batch.0);
            }
        }
        promote::promote(c, &self.inner.schema, &mut touched).await?;
        let payloads = touched.payloads();
        listen::send(c, &self.inner.schema.channel(), &touched.unsent()).await?;
        Ok((out, payloads))
    }

    /// SPEC E4, B3, D5: every batch named exists in this queue, is open, not halted, no
    /// job goes below its released stage, and every stored job one runs after is of its
    /// batch at no higher stage. The batches stay locked to the end of the
    /// transaction, so a concurrent `seal` or stage release cannot slip in between.
    /// Checked job by job in input order, so the first bad job names the error.
    /// Returns each batch's released stage.
    async fn check_batches(
        &self,
        c: &mut PgConnection,
        queue: &str,
        jobs: &[NewJob],
        parents: &HashMap<JobId, crate::after::Parent>,
    ) -> Result<Released> {
        let ids: BTreeSet<i64> = jobs.iter().filter_map(|j| j.batch.map(|b| b.0)).collect();
        if ids.is_empty() {
            return Ok(Released::new());
        }
        let ids: Vec<i64> = ids.into_iter().collect();
        let rows = promote::lock_batches(c, &self.inner.schema, &ids, &[]).await?;
        let batches: HashMap<i64, _> = rows
            .into_iter()
            .map(|(id, q, sealed, failed, released)| (id, (q, sealed, failed, released)))
            .collect();
        for job in jobs {
            let Some(batch) = job.batch else { continue };
            let (sealed, failed, released) = match batches.get(&batch.0) {
                Some((q, sealed, failed, released)) if q == queue => (*sealed, *failed, *released),
                _ => return Err(unknown(batch)),
            };
            if sealed {
                return Err(Error::invalid("batch", format!("batch {batch} is sealed")));
            }
            if failed {
                return Err(Error::invalid(
                    "batch",
                    format!("batch {batch} halted after a dead job"),
                ));
            }
            let stage = job.stage.unwrap_or(0);
            if let Some(r) = released.filter(|r| stage < *r) {
                return Err(Error::StageClosed { stage, released: r });
            }
            relayq_core::kit::after::check_job(job, parents)?;
        }
        Ok(batches
            .into_iter()
            .map(|(id, (_, _, _, released))| (id, released))
            .collect())
    }

    /// SPEC D4: the dependency policy of each batch of the call (locked already).
    async fn after_policies(
        &self,
        c: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<HashMap<i64, relayq_core::AfterFailure>> {
        let ids: Vec<i64> = jobs.iter().filter_map(|j| j.batch.map(|b| b.0)).collect();
        let rows: Vec<(i64, String)> = sqlx::query_as(
            self.sql("SELECT id, after_failure FROM {s}.batches WHERE id = ANY($1)"),
        )
        .bind(&ids)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(|(id, policy)| Ok((id, policy.parse()?)))
            .collect()
    }

    /// Inserts the jobs and works out each one's id: its own, or, when deduplicated,
    /// the holder's.
    async fn insert(
        &self,
        c: &mut PgConnection,
        queue: &str,
        jobs: &[NewJob],
        released: &Released,
        statement: &'static str,
    ) -> Result<Vec<Enqueued>> {
        let mut out: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        for _ in 0..DEDUPE_ROUNDS {
            let batch: Vec<&NewJob> = pending.iter().map(|&i| &jobs[i]).collect();
            let mut rows: Vec<(i64, Option<String>)> = self
                .insert_rows(c, queue, &batch, released, statement)
                .await?;
            rows.sort_unstable_by_key(|r| r.0);
            let inserted_keys: BTreeSet<&str> =
                rows.iter().filter_map(|r| r.1.as_deref()).collect();
            let mut ids = rows.iter().map(|r| r.0);
            // Within this round: the first job with a key is the inserted one, if any.
            let mut first_with: HashMap<&str, usize> = HashMap::new();
            let mut lookup = Vec::new();
            for &i in &pending {
                let key = jobs[i].dedupe_key.as_deref();
                match key {
                    None => out[i] = Some(fresh(ids.next())?),
                    Some(k) if inserted_keys.contains(k) && !first_with.contains_key(k) => {
                        first_with.insert(k, i);
                        out[i] = Some(fresh(ids.next())?);
                    }
                    Some(k) => match first_with.get(k).and_then(|&f| out[f]) {
                        Some(first) => out[i] = Some(dedup(first.id)),
                        None => {
                            first_with.entry(k).or_insert(i);
                            lookup.push(i);
                        }
                    },
                }
            }
            pending = self
                .resolve_holders(c, queue, jobs, &lookup, &mut out)
                .await?;
            if pending.is_empty() {
                return Ok(out.into_iter().flatten().collect());
            }
        }
        Err(Error::backend(
            "dedupe keys kept changing hands during the enqueue; nothing was stored",
        ))
    }

    /// Fills in the holders' ids for deduplicated jobs; returns the jobs whose key is
    /// free again (its holder finished meanwhile), to insert in another round.
    async fn resolve_holders(
        &self,
        c: &mut PgConnection,
        queue: &str,
        jobs: &[NewJob],
        lookup: &[usize],
        out: &mut [Option<Enqueued>],
    ) -> Result<Vec<usize>> {
        if lookup.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = lookup
            .iter()
            .filter_map(|&i| jobs[i].dedupe_key.as_deref())
            .collect();
        // One probe of the unique dedupe index per key: with `dedupe_key = ANY($2)` the
        // planner could read the queue through another index when the statistics
        // say no job has a key (`tests/statistics.rs`); a full-key equality on a
        // unique index is the one plan it never prices above a scan.
        let holders: HashMap<String, i64> = sqlx::query_as(self.sql(
            "SELECT k.key, j.id FROM unnest($2::text[]) AS k(key) CROSS JOIN LATERAL (
                     SELECT id FROM {s}.jobs
                     WHERE queue = $1 AND dedupe_key = k.key AND dedupe_key IS NOT NULL) j",
        ))
        .bind(queue)
        .bind(&keys)
        .fetch_all(&mut *c)
        .await
        .map_err(db)?
        .into_iter()
        .collect();
        let mut again = Vec::new();
        for &i in lookup {
            let key = jobs[i].dedupe_key.as_deref().unwrap_or_default();
            match holders.get(key) {
                Some(&id) => out[i] = Some(dedup(JobId(id))),
                None => again.push(i),
            }
        }
        // Jobs of the call sharing a key that is free again go round together: the
        // first is inserted, the others follow it.
        Ok(again)
    }

    async fn insert_rows(
        &self,
        c: &mut PgConnection,
        queue: &str,
        jobs: &[&NewJob],
        released: &Released,
        statement: &'static str,
    ) -> Result<Vec<(i64, Option<String>)>> {
        let mut payloads = Vec::with_capacity(jobs.len());
        let mut priorities = Vec::with_capacity(jobs.len());
        let mut run_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(jobs.len());
        let mut delays: Vec<Option<i64>> = Vec::with_capacity(jobs.len());
        let mut max_attempts = Vec::with_capacity(jobs.len());
        let mut groups = Vec::with_capacity(jobs.len());
        let mut batches = Vec::with_capacity(jobs.len());
        let mut stages = Vec::with_capacity(jobs.len());
        let mut keys = Vec::with_capacity(jobs.len());
        let mut who = Vec::with_capacity(jobs.len());
        let mut rel = Vec::with_capacity(jobs.len());
        let mut limit_keys = Vec::with_capacity(jobs.len());
        for job in jobs {
            limit_keys.push(job.limit_key.as_deref());
            payloads.push(job.payload.as_slice());
            priorities.push(job.priority);
            // Relative times resolve against the server's clock.
            let (at, delay) = match job.run_at {
                RunAt::Now => (None, None),
                RunAt::After(d) => (None, Some(micros(d))),
                RunAt::At(t) => (Some(t), None),
            };
            run_at.push(at);
            delays.push(delay);
            max_attempts.push(i16::try_from(job.max_attempts).map_err(Error::backend)?);
            groups.push(job.group.as_deref());
            batches.push(job.batch.map(|b| b.0));
            stages.push(job.batch.map(|_| job.stage.unwrap_or(0)));
            keys.push(job.dedupe_key.as_deref());
            who.push(job.enqueued_by.as_deref());
            // A job with dependencies starts blocked (SPEC D2): with no released
            // stage given, the insert stores it so; `after::store` decides.
            rel.push(
                job.batch
                    .filter(|_| job.after.is_empty())
                    .and_then(|b| released.get(&b.0).copied().flatten()),
            );
        }
        sqlx::query_as(self.sql(statement))
            .bind(queue)
            .bind(&payloads)
            .bind(&priorities)
            .bind(&run_at)
            .bind(&delays)
            .bind(&max_attempts)
            .bind(&groups)
            .bind(&batches)
            .bind(&stages)
            .bind(&keys)
            .bind(&who)
            .bind(self.inner.schema.channel())
            .bind(format!("{}:{queue}", listen::READY))
            .bind(&rel)
            .bind(&limit_keys)
            .fetch_all(&mut *c)
            .await
            .map_err(db)
    }
}

/// Whether no job has a group, a batch or a dedupe key: then one `INSERT` is the whole
/// enqueue, with nothing to check against other transactions.
fn all_plain(jobs: &[NewJob]) -> bool {
    jobs.iter()
        .all(|j| j.group.is_none() && j.batch.is_none() && j.dedupe_key.is_none())
}

fn unknown(batch: BatchId) -> Error {
    Error::invalid("batch", format!("batch {batch} is unknown in this queue"))
}

fn fresh(id: Option<i64>) -> Result<Enqueued> {
    let id = id.ok_or_else(|| Error::backend("insert returned fewer ids than jobs"))?;
    Ok(Enqueued {
        id: JobId(id),
        deduplicated: false,
    })
}

fn dedup(id: JobId) -> Enqueued {
    Enqueued {
        id,
        deduplicated: true,
    }
}

#[async_trait]
impl Enqueue for PostgresBackend {
    fn limits(&self) -> Limits {
        // Limit keys are enforced here (SPEC K), whatever the configuration says.
        Limits {
            limit_keys: true,
            rates: true,
            dependencies: true,
            ..self.inner.limits
        }
    }

    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let (out, payloads) = if all_plain(&jobs) {
            let mut c = self.inner.pool.acquire().await.map_err(db)?;
            let out = if jobs.iter().any(|j| j.limit_key.is_some()) {
                // Parked in the insert's transaction (SPEC K4), still without a
                // notification inside it.
                let mut tx = c.begin().await.map_err(db)?;
                let out = self.insert_plain(&mut tx, &jobs).await?;
                self.park_new(&mut tx, &jobs, &out).await?;
                tx.commit().await.map_err(db)?;
                out
            } else {
                self.insert_plain(&mut c, &jobs).await?
            };
            let payloads = vec![format!("{}:{}", listen::READY, jobs[0].queue)];
            listen::send_after_commit(&mut c, &self.inner.schema.channel(), &payloads).await;
            (out, payloads)
        } else {
            retry_transient(|| self.enqueue_tx(&jobs), crate::retryable).await?
        };
        self.notify_local(&payloads);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use relayq_conformance::harness::{Server, server_url};
    use sqlx::postgres::PgListener;

    use super::*;
    use crate::Config;

    /// SPEC W2 wake-ups, without the serialized commits: a plain enqueue's statement
    /// (the one `enqueue` runs) notifies no one from inside its own transaction. The
    /// queue's wake-up goes out after its commit (`listen::send_after_commit`), so
    /// concurrent enqueues do not commit one at a time behind PostgreSQL's notify lock.
    /// Checked by order: one listener hears notifications in commit order, so with a
    /// marker sent after the insert committed, the marker must come first. (With
    /// [`INSERT`] in `insert_plain`, the queue's notification comes first.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        relayq_no_postgres,
        ignore = "no postgres server: RELAYQ_POSTGRES_URL unset"
    )]
    async fn plain_insert_notifies_no_one_itself() {
        let url = server_url(Server::of(&crate::DRIVER))
            .await
            .expect("RELAYQ_POSTGRES_URL");
        let schema = crate::test_schema::fresh("quiet");
        let b = PostgresBackend::connect_with(&url, Config::default().with_schema(schema.clone()))
            .await
            .unwrap();
        b.migrate().await.unwrap();
        let channel = b.inner.schema.channel();
        let mut listener = PgListener::connect_with(b.pool()).await.unwrap();
        listener.listen(&channel).await.unwrap();
        let jobs = vec![NewJob::new("quiet", b"x".to_vec())];
        let mut c = b.pool().acquire().await.unwrap();
        let stored = b.insert_plain(&mut c, &jobs).await.unwrap();
        let marker = "marker".to_owned();
        listen::send(&mut c, &channel, std::slice::from_ref(&marker))
            .await
            .unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
            .await
            .expect("a notification within 5 s")
            .unwrap();
        drop(c);
        crate::test_schema::drop(b.pool(), &schema).await;
        assert_eq!(stored.len(), 1, "the job is stored");
        assert_eq!(
            first.payload(),
            marker,
            "the insert notified from its commit"
        );
    }
}
