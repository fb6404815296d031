//! Every T-SQL statement of this crate, in one place, so that one unit test can parse
//! them all (`sqlparser`, `MsSqlDialect`) and a syntax slip fails CI without a server.
//!
//! Templates: `{s}` is the quoted schema (`[relayq]`), `{n}` its bare name (validated
//! `a-z 0-9 _`). Values are always bound (`@P1`, ...) or passed as one JSON document
//! read with `OPENJSON` (SQL Server has no array parameters; tiberius sends no
//! table-valued parameters).
//!
//! Each operation is one batch and one round trip. A batch that writes runs its whole
//! transaction itself (`BEGIN TRANSACTION` ... `COMMIT`), with `XACT_ABORT` on for the
//! session, so any error rolls everything back and no transaction outlives its batch.
//! Results come back as result sets in a fixed order; every `SELECT` that returns
//! rows to the client runs unconditionally unless a comment says otherwise.
//!
//! Strings that are compared (group keys, dedupe keys) are stored with
//! [`KEY_END`](crate::keys) appended: SQL Server's `=` ignores trailing spaces, so
//! `'a'` and `'a '` would otherwise be one group. Columns compared with parameters are
//! `nvarchar` (tiberius binds strings as `nvarchar`; a `varchar` column would be
//! converted and lose its index seek) with a binary collation (case- and
//! accent-sensitive, like every other backend).

/// Session settings, once per connection. Filtered indexes need the ANSI settings;
/// `XACT_ABORT` makes any error roll back the whole transaction.
pub(crate) const SESSION: &str = "
SET ANSI_NULLS ON;
SET ANSI_PADDING ON;
SET ANSI_WARNINGS ON;
SET ARITHABORT ON;
SET CONCAT_NULL_YIELDS_NULL ON;
SET QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET XACT_ABORT ON;
SET NOCOUNT ON;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;";

/// Starts the migration transaction: takes the schema's migration lock (concurrent
/// starts wait here), creates the schema and the version table if missing, and returns
/// the applied version. The transaction stays open for [`MIGRATIONS`].
///
/// `{lock_ms}` is [`migrate_lock_timeout`] of the command timeout: every lock wait of
/// the migration (the application lock here, the schema locks its DDL takes) gives up
/// on the server, with error 51001 or 1222, before the client's command timeout would
/// cut the connection. `SET LOCK_TIMEOUT` lasts for the session, so
/// [`MIGRATE_COMMIT`] sets it back (a failed migration's connection is discarded).
pub(crate) const MIGRATE_BEGIN: &str = "
SET LOCK_TIMEOUT {lock_ms};
BEGIN TRANSACTION;
EXEC sp_getapplock @Resource = N'relayq migrate {n}', @LockMode = 'Exclusive',
    @LockOwner = 'Transaction', @LockTimeout = {lock_ms};
IF APPLOCK_MODE(N'public', N'relayq migrate {n}', N'Transaction') <> N'Exclusive'
    THROW 51001, N'relayq: timed out waiting for the migration lock', 1;
IF SCHEMA_ID(N'{n}') IS NULL EXEC (N'CREATE SCHEMA {s}');
IF OBJECT_ID(N'{s}.migrations', N'U') IS NULL
    CREATE TABLE {s}.migrations (
        version    int          NOT NULL PRIMARY KEY,
        applied_at datetime2(6) NOT NULL);
SELECT ISNULL(MAX(version), 0) AS version FROM {s}.migrations;";

/// Ends the migration transaction [`MIGRATE_BEGIN`] opened, and puts the session's
/// lock timeout back to the default (wait until the command timeout).
pub(crate) const MIGRATE_COMMIT: &str = "COMMIT TRANSACTION;
SET LOCK_TIMEOUT -1;";

/// The lock timeout of a migration, in ms, for a client command timeout of `command`:
/// three quarters of it, so a migrator waiting for another one's lock is told so by
/// the server (51001) instead of losing its connection to the command timeout (which
/// tiberius measures as silence on one round trip, and a lock wait is silent). The
/// rest leaves room for the work done in the same round trip after the wait. Never
/// negative: `-1` would mean "wait forever".
pub(crate) fn migrate_lock_timeout(command: std::time::Duration) -> i32 {
    i32::try_from(command.as_millis() / 4 * 3).unwrap_or(i32::MAX)
}

/// [`MIGRATE_BEGIN`] for a schema, with its lock timeout written in (an integer this
/// crate computes, never input).
pub(crate) fn migrate_begin(filled: &str, lock_ms: i32) -> String {
    filled.replace("{lock_ms}", &lock_ms.to_string())
}

/// Checks that a pooled connection still answers.
pub(crate) const PING: &str = "SELECT 1;";

/// After a request failed with a server error: how many transactions the session
/// still has open (0 means the connection can go back to the pool).
pub(crate) const TRANCOUNT: &str = "SELECT @@TRANCOUNT;";

/// The schema's version without changing anything: -1 when it has no migrations table.
/// The table is named inside `EXEC`, so the batch compiles where it is missing.
pub(crate) const SCHEMA_VERSION: &str = "
IF OBJECT_ID(N'{s}.migrations', N'U') IS NULL
    SELECT CAST(-1 AS int) AS version;
ELSE
    EXEC (N'SELECT ISNULL(MAX(version), 0) AS version FROM {s}.migrations');";

/// Records migration `@P1` as applied (inside the migration transaction).
pub(crate) const MIGRATE_RECORD: &str =
    "INSERT INTO {s}.migrations (version, applied_at) VALUES (@P1, SYSUTCDATETIME());";

/// The migrations, one entry per version.
///
/// 1. One table holds every job; finished ones keep their row (with `finished_at`)
///    until pruned. The hot indexes are filtered on the live states, so they cover
///    live work only, as PostgreSQL's separate `finished` table does.
/// 2. Lock escalation off on every queue table (`sys.tables.lock_escalation` 1 is
///    `DISABLE`; the check makes the step a no-op where it is already set, so it takes
///    no schema lock there). A statement that takes 5,000 locks on one table escalates
///    them to a table lock, and `READPAST` skips row locks only: every claim, settle
///    and heartbeat of every queue would wait for that transaction (SPEC C4). Three
///    statements can get there: an enqueue of up to 10,000 jobs (one `INSERT`, a key
///    lock per row in the clustered index and in each filtered index the row enters,
///    up to 8), a batch cancel (an update lock per live job of the batch) and a prune
///    (one `DELETE` of the attempts of 1,000 jobs, each with up to `max_attempts`
///    rows). Splitting them instead was rejected: an enqueue is one transaction (all
///    of its jobs or none, SPEC E4) and each statement reruns the dedupe check and
///    promotion; the locks per row vary with the indexes a row enters, so a safe
///    split would be a few hundred rows, and every new statement that touches many
///    rows would need the same care. The cost is lock memory (on the order of 100
///    bytes a lock: about 10 MB until commit for a 10,000-job enqueue). `ALTER TABLE`
///    takes a schema-modification lock, which waits for the operations in flight on
///    that table (all short) and holds new ones until the migration commits.
pub(crate) const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE {s}.jobs (
    id               bigint IDENTITY(1, 1) NOT NULL CONSTRAINT jobs_pk PRIMARY KEY,
    queue            nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    state            varchar(9)     NOT NULL,
    payload          varbinary(max) NOT NULL,
    priority         smallint       NOT NULL,
    run_at           datetime2(6)   NOT NULL,
    max_attempts     smallint       NOT NULL,
    attempts         smallint       NOT NULL,
    group_key        nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL,
    batch_id         bigint         NULL,
    stage            int            NULL,
    dedupe_key       nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL,
    enqueued_by      nvarchar(max)  NULL,
    created_at       datetime2(6)   NOT NULL,
    finished_at      datetime2(6)   NULL,
    last_error       nvarchar(max)  NULL,
    lease_token      uniqueidentifier NULL,
    lease_expires_at datetime2(6)   NULL,
    worker           nvarchar(max)  NULL,
    started_at       datetime2(6)   NULL,
    CONSTRAINT jobs_state CHECK (state IN ('ready', 'blocked', 'running', 'retrying',
                                           'succeeded', 'dead', 'cancelled')));
CREATE INDEX jobs_claim ON {s}.jobs (queue, priority, run_at, id)
    INCLUDE (state, lease_expires_at, attempts, max_attempts)
    WHERE state IN ('ready', 'retrying', 'running');
CREATE INDEX jobs_running ON {s}.jobs (queue, lease_expires_at)
    INCLUDE (attempts, max_attempts) WHERE state = 'running';
CREATE INDEX jobs_group ON {s}.jobs (queue, group_key, priority, run_at, id)
    INCLUDE (state, batch_id, stage)
    WHERE state IN ('ready', 'blocked', 'running', 'retrying');
CREATE INDEX jobs_stage ON {s}.jobs (batch_id, stage) INCLUDE (state, group_key, queue)
    WHERE state IN ('ready', 'blocked', 'running', 'retrying');
CREATE UNIQUE INDEX jobs_dedupe ON {s}.jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('ready', 'blocked', 'running', 'retrying');
CREATE INDEX jobs_queue ON {s}.jobs (queue, state, run_at);
CREATE INDEX jobs_batch ON {s}.jobs (batch_id, stage, state) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_finished ON {s}.jobs (queue, finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE {s}.attempts (
    job_id     bigint        NOT NULL,
    seq        bigint IDENTITY(1, 1) NOT NULL,
    attempt    smallint      NOT NULL,
    worker     nvarchar(max) NOT NULL,
    started_at datetime2(6)  NOT NULL,
    ended_at   datetime2(6)  NOT NULL,
    outcome    varchar(9)    NOT NULL,
    error      nvarchar(max) NULL,
    output     nvarchar(max) NULL,
    CONSTRAINT attempts_pk PRIMARY KEY (job_id, seq));
CREATE TABLE {s}.queues (
    queue       nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
    paused      bit NOT NULL,
    max_running int NULL);
CREATE TABLE {s}.batches (
    id             bigint IDENTITY(1, 1) NOT NULL CONSTRAINT batches_pk PRIMARY KEY,
    queue          nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    on_failure     varchar(8)   NOT NULL,
    sealed         bit          NOT NULL,
    failed         bit          NOT NULL,
    released_stage int          NULL,
    created_at     datetime2(6) NOT NULL);
CREATE INDEX batches_queue ON {s}.batches (queue, id);",
    "
IF EXISTS (SELECT 1 FROM sys.tables WHERE object_id = OBJECT_ID(N'{s}.jobs')
           AND lock_escalation <> 1)
    ALTER TABLE {s}.jobs SET (LOCK_ESCALATION = DISABLE);
IF EXISTS (SELECT 1 FROM sys.tables WHERE object_id = OBJECT_ID(N'{s}.attempts')
           AND lock_escalation <> 1)
    ALTER TABLE {s}.attempts SET (LOCK_ESCALATION = DISABLE);
IF EXISTS (SELECT 1 FROM sys.tables WHERE object_id = OBJECT_ID(N'{s}.batches')
           AND lock_escalation <> 1)
    ALTER TABLE {s}.batches SET (LOCK_ESCALATION = DISABLE);
IF EXISTS (SELECT 1 FROM sys.tables WHERE object_id = OBJECT_ID(N'{s}.queues')
           AND lock_escalation <> 1)
    ALTER TABLE {s}.queues SET (LOCK_ESCALATION = DISABLE);",
    "
CREATE TABLE {s}.schedules (
    queue      nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    name       nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
    definition nvarchar(max) NOT NULL,
    version    bigint        NOT NULL,
    mark       datetime2(6)  NOT NULL,
    paused     bit           NOT NULL,
    last_slot  datetime2(6)  NULL,
    last_job   bigint        NULL,
    last_batch bigint        NULL,
    CONSTRAINT schedules_pk PRIMARY KEY (queue, name));
ALTER TABLE {s}.schedules SET (LOCK_ESCALATION = DISABLE);",
    // A running job's progress as its handler last reported it, as the core's text
    // (SPEC L7); kept after the job finishes.
    "
ALTER TABLE {s}.jobs ADD progress nvarchar(max) NULL;",
    // Each worker's last beat to a queue it serves (SPEC M9), removed an hour after
    // its last beat.
    "
CREATE TABLE {s}.workers (
    queue     nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    name      nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
    beat      nvarchar(max) NOT NULL,
    last_seen datetime2(6)  NOT NULL,
    CONSTRAINT workers_pk PRIMARY KEY (queue, name));",
    // Batch progress reads each stage's last finish (SPEC M1) from the batch index.
    "
DROP INDEX jobs_batch ON {s}.jobs;
CREATE INDEX jobs_batch ON {s}.jobs (batch_id, stage, state) INCLUDE (finished_at)
    WHERE batch_id IS NOT NULL;",
    // The attempts a job was enqueued with, kept from its first dead retry on: each
    // retry adds it to max_attempts so that attempt numbers go on (SPEC M2); and a
    // batch's name, for people (SPEC B1).
    "
ALTER TABLE {s}.jobs ADD budget smallint NULL;
ALTER TABLE {s}.batches ADD name nvarchar(256) NULL;",
    // When each logged attempt was claimed, kept apart from its start (the claim plus
    // the job's wait in the worker's buffer, SPEC L5); NULL for attempts logged before.
    "
ALTER TABLE {s}.attempts ADD claimed_at datetime2(6) NULL;",
];

/// Declarations the promotion fragment needs; the batch fills the `@t*` tables with
/// what it touched. `@rq` and `@fq` collect the queues to wake (ready, finished).
macro_rules! promote_declare {
    () => {
        "
DECLARE @tb TABLE (id bigint NOT NULL PRIMARY KEY);
DECLARE @th TABLE (batch bigint NOT NULL PRIMARY KEY, stage int NOT NULL);
DECLARE @tg TABLE (queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
                   grp nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
                   res nvarchar(64) NULL, PRIMARY KEY (queue, grp));
DECLARE @hf TABLE (id bigint NOT NULL PRIMARY KEY, stage int NOT NULL);
DECLARE @hc TABLE (
    id bigint NOT NULL PRIMARY KEY, queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    group_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, prev varchar(9) NOT NULL,
    attempts smallint NOT NULL, worker nvarchar(max) NULL, started_at datetime2(6) NULL);
DECLARE @fl TABLE (id bigint NOT NULL PRIMARY KEY, floor int NULL);
DECLARE @st TABLE (queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
                   grp nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
                   busy bit NOT NULL, head bigint NULL);
DECLARE @rq TABLE (queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @fq TABLE (queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @locked int;
DECLARE @res nvarchar(64);
DECLARE @nextres nvarchar(64);
"
    };
}

/// Takes the promotion locks of what `@tb` and `@tg` name, in one order: the batches'
/// rows (update locks, by id), then the groups' application locks (by hashed name).
/// Write batches take them before their first write, so a transaction never waits for
/// one of these locks while holding a row another promotion must read. Re-entrant:
/// promotion takes them again after adding groups (a released stage's); those already
/// held are granted at once.
macro_rules! lock {
    () => {
        "
IF EXISTS (SELECT 1 FROM @tb) OR EXISTS (SELECT 1 FROM @tg)
BEGIN
    SELECT @locked = COUNT(*) FROM {s}.batches WITH (UPDLOCK, ROWLOCK, READCOMMITTEDLOCK)
    WHERE id IN (SELECT id FROM @tb);
    UPDATE @tg SET res = CONVERT(nvarchar(64),
        HASHBYTES('SHA2_256', CONCAT(N'{n}', NCHAR(31), queue, NCHAR(31), grp)), 2);
    SELECT @nextres = MIN(res) FROM @tg;
    WHILE @nextres IS NOT NULL
    BEGIN
        EXEC sp_getapplock @Resource = @nextres, @LockMode = 'Exclusive',
            @LockOwner = 'Transaction';
        IF APPLOCK_MODE(N'public', @nextres, N'Transaction') <> N'Exclusive'
            THROW 51205, N'relayq: a group lock was not granted', 1;
        SET @res = @nextres;
        SELECT @nextres = MIN(res) FROM @tg WHERE res > @res;
    END;
END;
"
    };
}

/// Promotion: what finishing (or adding) jobs releases, inside the batch's transaction.
/// The invariants, as in the PostgreSQL backend: per group at most one job is `ready`,
/// `running` or `retrying` (SPEC G1), and it is the group's earliest job of a released
/// stage (G2, G4); a batch job runs only when no unfinished job of its batch has a
/// lower stage (B2).
///
/// Serialized per batch by its row's update lock and per group by an application lock
/// (`sp_getapplock`, transaction-owned), taken in one order: batches by id, then groups
/// by hashed name. Deadlocks that remain (a cancel against a promotion of the same row)
/// are resolved by SQL Server choosing a victim (1205), which the caller runs again.
/// Within a group: first demote every `ready` job that is not the head (this waits
/// for a claim holding one, and skips it once it runs), then, in a new statement,
/// promote the head only if nothing of the group runs.
macro_rules! promote {
    () => {
        concat!(
            "
IF EXISTS (SELECT 1 FROM @tb) OR EXISTS (SELECT 1 FROM @tg)
BEGIN
",
            lock!(),
            "
    UPDATE b SET failed = 1
    OUTPUT inserted.id, h.stage INTO @hf (id, stage)
    FROM {s}.batches AS b INNER JOIN @th AS h ON h.batch = b.id
    WHERE b.on_failure = 'halt';
    UPDATE j SET state = 'cancelled', finished_at = @now, lease_token = NULL,
        lease_expires_at = NULL
    OUTPUT inserted.id, inserted.queue, inserted.group_key, deleted.state, deleted.attempts,
        deleted.worker, deleted.started_at
    INTO @hc (id, queue, group_key, prev, attempts, worker, started_at)
    FROM {s}.jobs AS j INNER JOIN @hf AS f ON j.batch_id = f.id
    WHERE j.stage >= f.stage AND j.state IN ('ready', 'blocked', 'running', 'retrying');
    -- relayq_core::cancelled_by::HALT, word for word (a test below checks).
    INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error,
                              claimed_at)
    SELECT id, attempts, ISNULL(worker, N''), ISNULL(started_at, @now), @now, 'cancelled',
        N'cancelled while running: a job of its batch died, halting it', started_at
    FROM @hc WHERE prev = 'running';
    INSERT INTO @tg (queue, grp)
    SELECT DISTINCT h.queue, h.group_key FROM @hc AS h
    WHERE h.group_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM @tg AS t WHERE t.queue = h.queue AND t.grp = h.group_key);
    INSERT INTO @fl (id, floor)
    SELECT t.id, (SELECT MIN(j.stage) FROM {s}.jobs AS j
                  WHERE j.batch_id = t.id AND j.state IN ('ready', 'blocked', 'running', 'retrying'))
    FROM @tb AS t;
    UPDATE x SET released_stage = f.floor
    FROM {s}.batches AS x INNER JOIN @fl AS f ON f.id = x.id
    WHERE f.floor IS NOT NULL AND (x.released_stage IS NULL OR x.released_stage < f.floor);
    UPDATE j SET state = 'ready'
    OUTPUT inserted.queue INTO @rq (queue)
    FROM {s}.jobs AS j INNER JOIN @fl AS f ON j.batch_id = f.id
    WHERE j.stage = f.floor AND j.state = 'blocked' AND j.group_key IS NULL;
    INSERT INTO @tg (queue, grp)
    SELECT DISTINCT j.queue, j.group_key
    FROM {s}.jobs AS j INNER JOIN @fl AS f ON j.batch_id = f.id
    WHERE j.stage = f.floor AND j.state = 'blocked' AND j.group_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM @tg AS t WHERE t.queue = j.queue AND t.grp = j.group_key);
",
            lock!(),
            "
    INSERT INTO @st (queue, grp, busy, head)
    SELECT g.queue, g.grp,
        CASE WHEN EXISTS (SELECT 1 FROM {s}.jobs AS b
                          WHERE b.queue = g.queue AND b.group_key = g.grp
                            AND b.state IN ('running', 'retrying')) THEN 1 ELSE 0 END,
        (SELECT TOP (1) j.id FROM {s}.jobs AS j
         WHERE j.queue = g.queue AND j.group_key = g.grp AND j.state IN ('ready', 'blocked')
           AND (j.batch_id IS NULL OR j.stage <= (
                SELECT MIN(f.stage) FROM {s}.jobs AS f
                WHERE f.batch_id = j.batch_id
                  AND f.state IN ('ready', 'blocked', 'running', 'retrying')))
         ORDER BY j.priority, j.run_at, j.id)
    FROM @tg AS g;
    UPDATE j SET state = 'blocked'
    FROM {s}.jobs AS j WITH (READCOMMITTEDLOCK)
    INNER JOIN @st AS st ON j.queue = st.queue AND j.group_key = st.grp
    WHERE st.busy = 0 AND j.state = 'ready' AND (st.head IS NULL OR j.id <> st.head);
    UPDATE j SET state = 'ready'
    OUTPUT inserted.queue INTO @rq (queue)
    FROM {s}.jobs AS j WITH (READCOMMITTEDLOCK) INNER JOIN @st AS st ON j.id = st.head
    WHERE st.busy = 0 AND j.state = 'blocked'
      AND NOT EXISTS (SELECT 1 FROM {s}.jobs AS b WITH (READCOMMITTEDLOCK)
                      WHERE b.queue = j.queue AND b.group_key = j.group_key
                        AND b.state IN ('running', 'retrying'));
END;
"
        )
    };
}

/// The queues to wake, after `COMMIT`: (`r` ready | `f` finished | `c` a running job
/// cancelled by a halt, queue).
macro_rules! events {
    () => {
        "
SELECT DISTINCT 'r' AS kind, queue FROM @rq
UNION
SELECT DISTINCT 'f' AS kind, queue FROM @fq
UNION
SELECT DISTINCT 'c' AS kind, queue FROM @hc WHERE prev = 'running';"
    };
}

/// SPEC C: claims `@P2` jobs of queue `@P1` for worker `@P4` with leases of `@P3` ms.
///
/// The claim itself is one statement: a CTE selects the earliest claimable jobs with
/// `ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK` (rows another claimer holds are
/// skipped, never waited for; the locking read is used even with
/// READ_COMMITTED_SNAPSHOT on, so a row is never claimed from a stale version), and
/// the `UPDATE` through it takes exactly those rows. Claimable: ready or retrying and
/// due, or running with an expired lease and attempts left (SPEC C5). `jobs_claim`
/// matches the `WHERE` and the `ORDER BY`, so the scan is an ordered index seek that
/// stops after `@n` rows. Taken-over attempts are closed in the log.
///
/// The index is pinned (`INDEX(jobs_claim), FORCESEEK`): the optimizer would pick it
/// from statistics, and a filtered index's statistics refresh only when the whole
/// table crosses its modification threshold, so a plan that scans another index and
/// sorts (locking every row it reads, and never stopping early) stays possible. With
/// the hints the plan is a seek on `queue = @P1` in key order, or, should the index
/// ever stop matching, error 8622 instead of a slow plan. The filter's state list is
/// written as literals here as in the index, which is what lets the hint be proven
/// to match at compile time; the statement references variables, so forced
/// parameterization leaves those literals alone.
///
/// A limited queue (SPEC C6) claims under its `queues` row's update lock and counts
/// live leases first, so its claimers take turns; unlimited queues take no lock but
/// the claimed rows'. Neither read of the `queues` row, nor the count, skips locked
/// rows: a locked `queues` row read past would look like "no limit", and a running
/// job read past (one whose heartbeat, settle or expiry is in flight, or that a
/// claimer which read the limit just before it was set is taking) would be left out
/// of the count, which lets the claim exceed the limit whenever that other
/// transaction leaves the job running (a heartbeat always does, a settle that rolls
/// back does). So these wait, for limited queues only, on transactions that are each
/// one short batch. `READCOMMITTEDLOCK` keeps the count a locking read with
/// READ_COMMITTED_SNAPSHOT on too, so it waits for such an in-flight claim rather
/// than count the version before it.
///
/// The `doomed` check (expired leases without attempts left, SPEC C5) does read past
/// locked rows: a row another transaction holds is being made dead (expiry) or
/// cancelled by it, the only writes a doomed row can get (it cannot be settled,
/// heartbeated or taken over, its lease being expired and its attempts spent), so it
/// is doomed no more once that commits, and should that roll back, the next claim or
/// maintenance pass finds it. It runs before `COMMIT`, so every read of a queue
/// table is inside the transaction and a deadlock victim rolls back all of it:
/// running the batch again never repeats a committed claim.
///
/// Result sets: the claimed jobs; whether expired jobs without attempts left wait to
/// be made dead.
pub(crate) const CLAIM: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @n int = @P2;
DECLARE @paused bit = 0;
DECLARE @max int = NULL;
DECLARE @running int = 0;
DECLARE @doomed int = 0;
DECLARE @c TABLE (
    id bigint NOT NULL PRIMARY KEY, token uniqueidentifier NOT NULL, attempts smallint NOT NULL,
    payload varbinary(max) NOT NULL, priority smallint NOT NULL, run_at datetime2(6) NOT NULL,
    max_attempts smallint NOT NULL, group_key nvarchar(256) NULL, batch_id bigint NULL,
    stage int NULL, enqueued_by nvarchar(max) NULL, expires datetime2(6) NOT NULL,
    prev varchar(9) NOT NULL, prev_worker nvarchar(max) NULL, prev_started datetime2(6) NULL);
BEGIN TRANSACTION;
SELECT @paused = paused, @max = max_running FROM {s}.queues WHERE queue = @P1;
IF @max IS NOT NULL AND @paused = 0
BEGIN
    SELECT @paused = paused, @max = max_running
    FROM {s}.queues WITH (UPDLOCK, HOLDLOCK, ROWLOCK) WHERE queue = @P1;
    SELECT @running = COUNT(*) FROM {s}.jobs WITH (READCOMMITTEDLOCK)
    WHERE queue = @P1 AND state = 'running' AND lease_expires_at > @now;
    IF @max IS NOT NULL AND @max - @running < @n SET @n = @max - @running;
END;
IF @paused = 1 SET @n = 0;
IF @n > 0
BEGIN
    WITH c AS (
        SELECT TOP (@n) * FROM {s}.jobs
            WITH (INDEX(jobs_claim), FORCESEEK, ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK)
        WHERE queue = @P1 AND state IN ('ready', 'retrying', 'running')
          AND ((state <> 'running' AND run_at <= @now)
               OR (state = 'running' AND lease_expires_at <= @now
                   AND attempts < max_attempts))
        ORDER BY priority, run_at, id)
    UPDATE c SET state = 'running', attempts = attempts + 1, lease_token = NEWID(),
        lease_expires_at = DATEADD(millisecond, @P3, @now), worker = @P4, started_at = @now,
        last_error = CASE WHEN state = 'running' THEN N'lease expired' ELSE last_error END
    OUTPUT inserted.id, inserted.lease_token, inserted.attempts, inserted.payload,
        inserted.priority, inserted.run_at, inserted.max_attempts, inserted.group_key,
        inserted.batch_id, inserted.stage, inserted.enqueued_by, inserted.lease_expires_at,
        deleted.state, deleted.worker, deleted.started_at
    INTO @c (id, token, attempts, payload, priority, run_at, max_attempts, group_key,
             batch_id, stage, enqueued_by, expires, prev, prev_worker, prev_started);
    INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error,
                              claimed_at)
    SELECT id, attempts - 1, ISNULL(prev_worker, N''), ISNULL(prev_started, @now), @now,
           'expired', N'lease expired', prev_started
    FROM @c WHERE prev = 'running';
END;
IF EXISTS (SELECT 1 FROM {s}.jobs WITH (READPAST, READCOMMITTEDLOCK)
           WHERE queue = @P1 AND state = 'running' AND lease_expires_at <= @now
             AND attempts >= max_attempts)
    SET @doomed = 1;
COMMIT TRANSACTION;
SELECT id, token, attempts, payload, priority, run_at, max_attempts, group_key, batch_id,
       stage, enqueued_by, expires
FROM @c ORDER BY priority, run_at, id;
SELECT @doomed AS doomed;";

/// SPEC L: settles the leases in JSON `@P1`, each fenced by its token, its queue and
/// an unexpired lease (L1), in one transaction with promotion. Result sets: one row
/// per settled lease (input position, next state, retry time); the queues to wake.
pub(crate) const SETTLE: &str = concat!(
    "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @i TABLE (
    ord int NOT NULL PRIMARY KEY, id bigint NOT NULL, token uniqueidentifier NOT NULL,
    queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, kind varchar(8) NOT NULL, days int NULL, ms int NULL,
    retry_at datetime2(6) NULL, error nvarchar(max) NULL, output nvarchar(max) NULL,
    wait_ms int NULL);
DECLARE @m TABLE (
    ord int NOT NULL, id bigint NOT NULL PRIMARY KEY,
    queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    next varchar(9) NOT NULL, run_at datetime2(6) NOT NULL, attempts smallint NOT NULL,
    group_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, batch_id bigint NULL, stage int NULL,
    worker nvarchar(max) NULL, started_at datetime2(6) NULL, kind varchar(8) NOT NULL,
    error nvarchar(max) NULL, output nvarchar(max) NULL, claimed_at datetime2(6) NULL);",
    promote_declare!(),
    "
INSERT INTO @i (ord, id, token, queue, kind, days, ms, retry_at, error, output, wait_ms)
SELECT ord, id, token, queue, kind, days, ms, retry_at, error, output, wait_ms
FROM OPENJSON(@P1) WITH (
    ord int '$.ord', id bigint '$.id', token uniqueidentifier '$.token',
    queue nvarchar(128) '$.queue', kind varchar(8) '$.kind', days int '$.days', ms int '$.ms',
    retry_at datetime2(6) '$.at', error nvarchar(max) '$.error',
    output nvarchar(max) '$.output', wait_ms int '$.wait_ms');
BEGIN TRANSACTION;
INSERT INTO @tb (id)
SELECT DISTINCT j.batch_id FROM {s}.jobs AS j INNER JOIN @i AS i ON i.id = j.id
WHERE j.batch_id IS NOT NULL AND j.queue = i.queue;
INSERT INTO @tg (queue, grp)
SELECT DISTINCT j.queue, j.group_key FROM {s}.jobs AS j INNER JOIN @i AS i ON i.id = j.id
WHERE j.group_key IS NOT NULL AND j.queue = i.queue;",
    lock!(),
    "
-- A release leaves the job as before its claim (SPEC L4): retrying, holding its group,
-- when an earlier attempt counted (SPEC G2); else ready.
UPDATE j SET
    state = CASE WHEN i.kind = 'complete' THEN 'succeeded'
                 WHEN i.kind = 'release' AND CAST(j.attempts AS int)
                      > 1 + j.max_attempts - COALESCE(j.budget, j.max_attempts) THEN 'retrying'
                 WHEN i.kind = 'release' THEN 'ready'
                 WHEN j.attempts < j.max_attempts
                      AND (i.days IS NOT NULL OR i.retry_at IS NOT NULL) THEN 'retrying'
                 ELSE 'dead' END,
    run_at = CASE WHEN i.kind <> 'fail' OR j.attempts >= j.max_attempts THEN j.run_at
                  WHEN i.retry_at IS NOT NULL AND i.retry_at > @now THEN i.retry_at
                  WHEN i.retry_at IS NOT NULL THEN @now
                  WHEN i.days IS NOT NULL THEN DATEADD(millisecond, i.ms, DATEADD(day, i.days, @now))
                  ELSE j.run_at END,
    attempts = CASE WHEN i.kind = 'release' THEN j.attempts - 1 ELSE j.attempts END,
    last_error = CASE WHEN i.kind = 'fail' THEN i.error ELSE j.last_error END,
    finished_at = CASE WHEN i.kind = 'complete' THEN @now
                       WHEN i.kind = 'release' THEN NULL
                       WHEN j.attempts < j.max_attempts
                            AND (i.days IS NOT NULL OR i.retry_at IS NOT NULL) THEN NULL
                       ELSE @now END,
    lease_token = NULL, lease_expires_at = NULL
OUTPUT i.ord, inserted.id, inserted.queue, inserted.state, inserted.run_at, deleted.attempts,
    inserted.group_key, inserted.batch_id, inserted.stage, deleted.worker,
    -- The handler's start (SPEC L5): the claim plus its wait in the worker.
    CASE WHEN DATEADD(millisecond, ISNULL(i.wait_ms, 0), deleted.started_at) < @now
         THEN DATEADD(millisecond, ISNULL(i.wait_ms, 0), deleted.started_at) ELSE @now END,
    i.kind, i.error, i.output, deleted.started_at
INTO @m (ord, id, queue, next, run_at, attempts, group_key, batch_id, stage, worker,
         started_at, kind, error, output, claimed_at)
FROM {s}.jobs AS j WITH (ROWLOCK, READCOMMITTEDLOCK) INNER JOIN @i AS i ON i.id = j.id
WHERE j.lease_token = i.token AND j.queue = i.queue AND j.state = 'running'
  AND j.lease_expires_at > @now;
INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error, output,
                          claimed_at)
SELECT id, attempts, ISNULL(worker, N''), ISNULL(started_at, @now), @now,
       CASE kind WHEN 'complete' THEN 'succeeded' WHEN 'release' THEN 'released'
                 ELSE 'failed' END,
       error, output, claimed_at
FROM @m;
INSERT INTO @rq (queue) SELECT queue FROM @m WHERE next = 'ready' OR kind = 'release';
INSERT INTO @fq (queue) SELECT queue FROM @m
WHERE batch_id IS NOT NULL AND next IN ('succeeded', 'dead');
INSERT INTO @th (batch, stage) SELECT batch_id, MIN(stage) FROM @m
WHERE next = 'dead' AND batch_id IS NOT NULL AND stage IS NOT NULL GROUP BY batch_id;",
    promote!(),
    "
COMMIT TRANSACTION;
SELECT ord, CASE WHEN kind = 'release' THEN 'ready' ELSE next END, run_at FROM @m;",
    events!()
);

/// Extends the lease `@P1` (id) / `@P2` (token) / `@P3` (queue) by `@P4` ms. Result
/// set: the new expiry, or no row.
///
/// Like every `OUTPUT` in this crate, it goes `INTO` a table variable that a `SELECT`
/// then returns: an `OUTPUT` that returns rows straight to the client fails with
/// error 334 as soon as the table has an enabled trigger (someone's audit trigger),
/// which relayq does not control.
pub(crate) const HEARTBEAT: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @h TABLE (expires datetime2(6) NOT NULL);
UPDATE {s}.jobs WITH (ROWLOCK) SET lease_expires_at = DATEADD(millisecond, @P4, @now)
OUTPUT inserted.lease_expires_at INTO @h (expires)
WHERE id = @P1 AND lease_token = @P2 AND queue = @P3 AND state = 'running'
  AND lease_expires_at > @now;
SELECT expires FROM @h;";

/// SPEC E: stores the jobs in JSON `@P2` in queue `@P1`, in input order (so their ids
/// increase in that order). Checks their batches first (E4, B3), under the batches'
/// update locks; skips jobs whose dedupe key a live job holds (E3), under a key-range
/// lock on that key so a concurrent enqueue of the same key waits; then promotes.
///
/// Result sets: the first job that failed a batch check (or a row of NULLs), and, only
/// when none failed: the inserted ids, the holders of the call's dedupe keys, the
/// queues to wake.
pub(crate) const ENQUEUE: &str = concat!(
    "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @in TABLE (
    ord int NOT NULL PRIMARY KEY, payload nvarchar(max) NOT NULL, priority smallint NOT NULL,
    run_at datetime2(6) NULL, days int NULL, ms int NULL, max_attempts smallint NOT NULL,
    grp nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, batch bigint NULL, stage int NULL,
    dedupe nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, who nvarchar(max) NULL,
    first bigint NOT NULL);
DECLARE @ins TABLE (id bigint NOT NULL PRIMARY KEY,
                    dedupe nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL);
DECLARE @bad int = NULL;
DECLARE @why varchar(8) = NULL;
DECLARE @stage int = NULL;
DECLARE @released int = NULL;",
    promote_declare!(),
    "
INSERT INTO @in (ord, payload, priority, run_at, days, ms, max_attempts, grp, batch, stage,
                 dedupe, who, first)
SELECT ord, payload, priority, run_at, days, ms, max_attempts, grp, batch, stage, dedupe, who,
       ROW_NUMBER() OVER (PARTITION BY dedupe COLLATE Latin1_General_100_BIN2 ORDER BY ord)
FROM OPENJSON(@P2) WITH (
    ord int '$.ord', payload nvarchar(max) '$.payload', priority smallint '$.priority',
    run_at datetime2(6) '$.at', days int '$.days', ms int '$.ms',
    max_attempts smallint '$.max_attempts', grp nvarchar(256) '$.group',
    batch bigint '$.batch', stage int '$.stage', dedupe nvarchar(256) '$.dedupe',
    who nvarchar(max) '$.who');
BEGIN TRANSACTION;
INSERT INTO @tb (id) SELECT DISTINCT batch FROM @in WHERE batch IS NOT NULL;
INSERT INTO @tg (queue, grp) SELECT DISTINCT @P1, grp FROM @in WHERE grp IS NOT NULL;",
    lock!(),
    "
IF EXISTS (SELECT 1 FROM @in WHERE batch IS NOT NULL)
BEGIN
    SELECT TOP (1) @bad = i.ord, @stage = i.stage, @released = b.released_stage,
        @why = CASE WHEN b.id IS NULL OR b.queue <> @P1 THEN 'unknown'
                    WHEN b.sealed = 1 THEN 'sealed'
                    WHEN b.failed = 1 THEN 'halted'
                    ELSE 'closed' END
    FROM @in AS i LEFT JOIN {s}.batches AS b WITH (READCOMMITTEDLOCK) ON b.id = i.batch
    WHERE i.batch IS NOT NULL
      AND (b.id IS NULL OR b.queue <> @P1 OR b.sealed = 1 OR b.failed = 1
           OR i.stage < b.released_stage)
    ORDER BY i.ord;
END;
SELECT @bad AS bad, @why AS why, @stage AS stage, @released AS released;
IF @bad IS NOT NULL
BEGIN
    ROLLBACK TRANSACTION;
    RETURN;
END;
INSERT INTO {s}.jobs (queue, state, payload, priority, run_at, max_attempts, attempts,
                      group_key, batch_id, stage, dedupe_key, enqueued_by, created_at)
OUTPUT inserted.id, inserted.dedupe_key INTO @ins (id, dedupe)
SELECT @P1, CASE WHEN i.grp IS NULL AND i.batch IS NULL THEN 'ready' ELSE 'blocked' END,
       CONVERT(varbinary(max), i.payload, 2), i.priority,
       CASE WHEN i.run_at IS NOT NULL THEN i.run_at
            WHEN i.days IS NOT NULL THEN DATEADD(millisecond, i.ms, DATEADD(day, i.days, @now))
            ELSE @now END,
       i.max_attempts, 0, i.grp, i.batch, i.stage, i.dedupe, i.who, @now
FROM @in AS i
WHERE i.dedupe IS NULL
   OR (i.first = 1 AND NOT EXISTS (
        SELECT 1 FROM {s}.jobs AS d WITH (UPDLOCK, HOLDLOCK)
        WHERE d.queue = @P1 AND d.dedupe_key = i.dedupe AND d.dedupe_key IS NOT NULL
          AND d.state IN ('ready', 'blocked', 'running', 'retrying')))
ORDER BY i.ord;
INSERT INTO @rq (queue) VALUES (@P1);
SELECT id FROM @ins ORDER BY id;
SELECT d.dedupe_key, d.id FROM {s}.jobs AS d
WHERE d.queue = @P1 AND d.state IN ('ready', 'blocked', 'running', 'retrying')
  AND d.dedupe_key IN (SELECT dedupe FROM @in WHERE dedupe IS NOT NULL);",
    promote!(),
    "
COMMIT TRANSACTION;",
    events!()
);

/// Cancels the live jobs listed in `@cx` (locked by the batch): they become
/// `cancelled`, and a running one's attempt is closed in the log with the reason `@P3`,
/// which revokes its lease (SPEC B7, B8). The caller has put their batches and groups in `@tb`/`@tg` and
/// locked them, and promotes after.
macro_rules! cancel {
    () => {
        "
UPDATE j SET state = 'cancelled', finished_at = @now, lease_token = NULL,
    lease_expires_at = NULL
OUTPUT inserted.id, inserted.queue, inserted.group_key, inserted.batch_id, deleted.state,
    deleted.attempts, deleted.worker, deleted.started_at
INTO @cd (id, queue, group_key, batch_id, prev, attempts, worker, started_at)
FROM {s}.jobs AS j INNER JOIN @cx AS x ON x.id = j.id
WHERE j.state IN ('ready', 'blocked', 'running', 'retrying');
INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error,
                          claimed_at)
SELECT id, attempts, ISNULL(worker, N''), ISNULL(started_at, @now), @now, 'cancelled', @P3,
       started_at
FROM @cd WHERE prev = 'running';
INSERT INTO @fq (queue) SELECT queue FROM @cd;
"
    };
}

macro_rules! cancel_declare {
    () => {
        "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @cx TABLE (id bigint NOT NULL PRIMARY KEY);
DECLARE @cd TABLE (
    id bigint NOT NULL PRIMARY KEY, queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    group_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, batch_id bigint NULL, prev varchar(9) NOT NULL, attempts smallint NOT NULL,
    worker nvarchar(max) NULL, started_at datetime2(6) NULL);"
    };
}

/// Cancels job `@P1` of queue `@P2`. Result sets: its state before (NULL when there
/// is no such job); the queues to wake.
pub(crate) const CANCEL_JOB: &str = concat!(
    cancel_declare!(),
    promote_declare!(),
    "
DECLARE @found varchar(9) = NULL;
BEGIN TRANSACTION;
INSERT INTO @tb (id)
SELECT batch_id FROM {s}.jobs WHERE id = @P1 AND queue = @P2 AND batch_id IS NOT NULL;
INSERT INTO @tg (queue, grp)
SELECT queue, group_key FROM {s}.jobs WHERE id = @P1 AND queue = @P2 AND group_key IS NOT NULL;",
    lock!(),
    "
SELECT @found = state FROM {s}.jobs WITH (UPDLOCK, ROWLOCK, READCOMMITTEDLOCK)
WHERE id = @P1 AND queue = @P2;
INSERT INTO @cx (id) SELECT @P1 WHERE @found IN ('ready', 'blocked', 'running', 'retrying');",
    cancel!(),
    promote!(),
    "
COMMIT TRANSACTION;
SELECT @found AS found;",
    events!()
);

/// Cancels every live job of batch `@P1` of queue `@P2` and seals it. Seals first,
/// which locks the batch (so no enqueue into it is under way and none can follow),
/// then locks its groups, then its jobs: the order every write batch uses. Result
/// sets: (batch found, jobs cancelled); the queues to wake.
pub(crate) const CANCEL_BATCH: &str = concat!(
    cancel_declare!(),
    promote_declare!(),
    "
DECLARE @sealed int = 0;
BEGIN TRANSACTION;
UPDATE {s}.batches SET sealed = 1 WHERE id = @P1 AND queue = @P2;
SET @sealed = @@ROWCOUNT;
INSERT INTO @tb (id) SELECT @P1 WHERE @sealed > 0;
INSERT INTO @tg (queue, grp)
SELECT DISTINCT queue, group_key FROM {s}.jobs
WHERE @sealed > 0 AND batch_id = @P1 AND group_key IS NOT NULL
  AND state IN ('ready', 'blocked', 'running', 'retrying');",
    lock!(),
    "
INSERT INTO @cx (id)
SELECT id FROM {s}.jobs WITH (UPDLOCK, ROWLOCK, READCOMMITTEDLOCK)
WHERE @sealed > 0 AND batch_id = @P1
  AND state IN ('ready', 'blocked', 'running', 'retrying');",
    cancel!(),
    "
IF @sealed > 0 INSERT INTO @fq (queue) VALUES (@P2);",
    promote!(),
    "
COMMIT TRANSACTION;
SELECT @sealed AS found, (SELECT COUNT(*) FROM @cd) AS cancelled;",
    events!()
);

/// SPEC M2: revives dead jobs of queue `@P1` (all, or the ids in JSON array `@P2`),
/// attempts counting on and `max_attempts` grown by the enqueued budget.
/// Jobs of a batch stay dead (reviving one after later stages started would break the
/// barrier), and so does a job whose dedupe key a live job holds (of two dead jobs
/// sharing a key, the first wins). Result sets: how many; the queues to wake.
pub(crate) const RETRY_DEAD: &str = concat!(
    "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @ids TABLE (id bigint NOT NULL PRIMARY KEY);
DECLARE @rv TABLE (id bigint NOT NULL PRIMARY KEY,
                   group_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL);",
    promote_declare!(),
    "
INSERT INTO @ids (id) SELECT DISTINCT id FROM OPENJSON(@P2) WITH (id bigint '$');
BEGIN TRANSACTION;
INSERT INTO @tg (queue, grp)
SELECT DISTINCT queue, group_key FROM {s}.jobs
WHERE queue = @P1 AND state = 'dead' AND batch_id IS NULL AND group_key IS NOT NULL
  AND (@P2 IS NULL OR id IN (SELECT id FROM @ids));",
    lock!(),
    "
UPDATE j SET state = CASE WHEN j.group_key IS NULL THEN 'ready' ELSE 'blocked' END,
    run_at = @now, finished_at = NULL,
    max_attempts = CASE WHEN CAST(j.attempts AS int) + COALESCE(j.budget, j.max_attempts) > 32767
                        THEN 32767
                        ELSE CAST(j.attempts AS int) + COALESCE(j.budget, j.max_attempts) END,
    budget = COALESCE(j.budget, j.max_attempts)
OUTPUT inserted.id, inserted.group_key INTO @rv (id, group_key)
FROM {s}.jobs AS j WITH (ROWLOCK, READCOMMITTEDLOCK)
WHERE j.queue = @P1 AND j.state = 'dead' AND j.batch_id IS NULL AND j.attempts < 32767
  AND (@P2 IS NULL OR j.id IN (SELECT id FROM @ids))
  AND (j.dedupe_key IS NULL
       OR (NOT EXISTS (SELECT 1 FROM {s}.jobs AS d WITH (UPDLOCK, HOLDLOCK)
                       WHERE d.queue = j.queue AND d.dedupe_key = j.dedupe_key
                         AND d.dedupe_key IS NOT NULL
                         AND d.state IN ('ready', 'blocked', 'running', 'retrying'))
           AND j.id = (SELECT MIN(x.id) FROM {s}.jobs AS x
                       WHERE x.queue = j.queue AND x.dedupe_key = j.dedupe_key
                         AND x.state = 'dead' AND x.batch_id IS NULL AND x.attempts < 32767
                         AND (@P2 IS NULL OR x.id IN (SELECT id FROM @ids)))));
INSERT INTO @rq (queue) VALUES (@P1);",
    promote!(),
    "
COMMIT TRANSACTION;
SELECT COUNT(*) AS revived FROM @rv;",
    events!()
);

/// SPEC C5: running jobs of queue `@P1` whose lease expired are closed in the log and
/// retry in place, or, without attempts left (or all of them when `@P2` is 0), are
/// dead, which releases what waited for them. Rows another transaction holds are
/// skipped. Result sets: (requeued, dead); the queues to wake.
pub(crate) const EXPIRE: &str = concat!(
    "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @e TABLE (
    id bigint NOT NULL PRIMARY KEY, next varchar(9) NOT NULL,
    queue nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, group_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NULL, batch_id bigint NULL, stage int NULL,
    attempts smallint NOT NULL, worker nvarchar(max) NULL, started_at datetime2(6) NULL);",
    promote_declare!(),
    "
BEGIN TRANSACTION;
INSERT INTO @tb (id)
SELECT DISTINCT batch_id FROM {s}.jobs
WHERE queue = @P1 AND state = 'running' AND lease_expires_at <= @now
  AND (@P2 = 1 OR attempts >= max_attempts) AND batch_id IS NOT NULL;
INSERT INTO @tg (queue, grp)
SELECT DISTINCT queue, group_key FROM {s}.jobs
WHERE queue = @P1 AND state = 'running' AND lease_expires_at <= @now
  AND (@P2 = 1 OR attempts >= max_attempts) AND group_key IS NOT NULL;",
    lock!(),
    "
UPDATE j SET state = CASE WHEN j.attempts < j.max_attempts THEN 'retrying' ELSE 'dead' END,
    last_error = N'lease expired', lease_token = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE @now END
OUTPUT inserted.id, inserted.state, inserted.queue, inserted.group_key, inserted.batch_id,
    inserted.stage, deleted.attempts, deleted.worker, deleted.started_at
INTO @e (id, next, queue, group_key, batch_id, stage, attempts, worker, started_at)
FROM {s}.jobs AS j WITH (ROWLOCK, READPAST, READCOMMITTEDLOCK)
WHERE j.queue = @P1 AND j.state = 'running' AND j.lease_expires_at <= @now
  AND (@P2 = 1 OR j.attempts >= j.max_attempts);
INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, ended_at, outcome, error,
                          claimed_at)
SELECT id, attempts, ISNULL(worker, N''), ISNULL(started_at, @now), @now, 'expired',
       N'lease expired', started_at
FROM @e;
INSERT INTO @rq (queue) SELECT DISTINCT queue FROM @e WHERE next = 'retrying';
INSERT INTO @fq (queue) SELECT queue FROM @e WHERE next = 'dead' AND batch_id IS NOT NULL;
INSERT INTO @th (batch, stage) SELECT batch_id, MIN(stage) FROM @e
WHERE next = 'dead' AND batch_id IS NOT NULL AND stage IS NOT NULL GROUP BY batch_id;",
    promote!(),
    "
COMMIT TRANSACTION;
SELECT (SELECT COUNT(*) FROM @e WHERE next = 'retrying') AS requeued,
       (SELECT COUNT(*) FROM @e WHERE next = 'dead') AS dead;",
    events!()
);

/// SPEC M3: deletes up to `@P4` finished jobs of queue `@P1` older than `@P2` days and
/// `@P3` ms, with their log. Chunked by the caller, so no statement takes enough locks
/// to escalate to a table lock. Result set: how many.
pub(crate) const PRUNE: &str = "
DECLARE @p TABLE (id bigint NOT NULL PRIMARY KEY);
DECLARE @cutoff datetime2(6) = DATEADD(millisecond, -@P3, DATEADD(day, -@P2, SYSUTCDATETIME()));
BEGIN TRANSACTION;
INSERT INTO @p (id)
SELECT TOP (@P4) id FROM {s}.jobs WITH (ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK)
WHERE queue = @P1 AND finished_at IS NOT NULL AND finished_at <= @cutoff;
DELETE FROM {s}.attempts WHERE job_id IN (SELECT id FROM @p);
DELETE FROM {s}.jobs WHERE id IN (SELECT id FROM @p) AND finished_at IS NOT NULL;
COMMIT TRANSACTION;
SELECT COUNT(*) AS pruned FROM @p;";

/// SPEC M8: deletes the finished jobs of queue `@P1` among the ids of JSON array `@P2`,
/// with their logs; returns how many.
pub(crate) const DELETE_JOBS: &str = "
DECLARE @d TABLE (id bigint NOT NULL PRIMARY KEY);
BEGIN TRANSACTION;
DELETE FROM {s}.jobs OUTPUT deleted.id INTO @d
WHERE id IN (SELECT CAST(value AS bigint) FROM OPENJSON(@P2))
  AND queue = @P1 AND state IN ('succeeded', 'dead', 'cancelled');
DELETE FROM {s}.attempts WHERE job_id IN (SELECT id FROM @d);
COMMIT TRANSACTION;
SELECT COUNT(*) AS deleted FROM @d;";

/// SPEC M10: makes the jobs of queue `@P1` among the ids of JSON array `@P2` that wait
/// only for their time due now; returns how many. A `ready` job is never blocked, and
/// a ready grouped job is its group's next: an earlier `run_at` keeps it first there.
pub(crate) const RUN_NOW: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
UPDATE {s}.jobs WITH (ROWLOCK) SET run_at = @now
WHERE id IN (SELECT CAST(value AS bigint) FROM OPENJSON(@P2))
  AND queue = @P1 AND state IN ('ready', 'retrying') AND run_at > @now;
SELECT @@ROWCOUNT AS moved;";

/// SPEC M9: stores beat `@P3` of worker `@P2` for queue `@P1` with the server's time,
/// and drops the queue's beats older than `@P4` seconds.
pub(crate) const WORKER_BEAT: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE {s}.workers WITH (UPDLOCK, SERIALIZABLE) SET beat = @P3, last_seen = @now
WHERE queue = @P1 AND name = @P2;
IF @@ROWCOUNT = 0
    INSERT INTO {s}.workers (queue, name, beat, last_seen) VALUES (@P1, @P2, @P3, @now);
DELETE FROM {s}.workers WHERE queue = @P1 AND last_seen < DATEADD(second, -@P4, @now);
COMMIT TRANSACTION;";

/// SPEC M9: the beats of queue `@P1` from the last `@P2` seconds, the most recent first.
pub(crate) const WORKERS: &str = "
SELECT beat, last_seen FROM {s}.workers
WHERE queue = @P1 AND last_seen > DATEADD(second, -@P2, SYSUTCDATETIME())
ORDER BY last_seen DESC, name;";

/// Deletes sealed batches of queue `@P1` that have no job left.
pub(crate) const PRUNE_BATCHES: &str = "
DELETE FROM {s}.batches WHERE queue = @P1 AND sealed = 1
  AND id NOT IN (SELECT j.batch_id FROM {s}.jobs AS j WHERE j.batch_id IS NOT NULL);";

/// Pauses, resumes or limits queue `@P1`: `@P2` paused (NULL keeps it), `@P3` whether
/// to set `max_running` to `@P4`. Update-or-insert under a key-range lock, so two
/// first settings of one queue do not both insert.
pub(crate) const SET_QUEUE: &str = "
BEGIN TRANSACTION;
UPDATE {s}.queues WITH (UPDLOCK, SERIALIZABLE)
SET paused = COALESCE(@P2, paused),
    max_running = CASE WHEN @P3 = 1 THEN @P4 ELSE max_running END
WHERE queue = @P1;
IF @@ROWCOUNT = 0
    INSERT INTO {s}.queues (queue, paused, max_running) VALUES (@P1, COALESCE(@P2, 0), @P4);
COMMIT TRANSACTION;";

/// Opens a batch in queue `@P1` with failure policy `@P2` and name `@P3` (or NULL);
/// returns its id (`OUTPUT INTO`, as in [`HEARTBEAT`]).
pub(crate) const OPEN_BATCH: &str = "
DECLARE @b TABLE (id bigint NOT NULL);
INSERT INTO {s}.batches (queue, on_failure, sealed, failed, created_at, name)
OUTPUT inserted.id INTO @b (id)
VALUES (@P1, @P2, 0, 0, SYSUTCDATETIME(), @P3);
SELECT id FROM @b;";

/// Seals batch `@P1` of queue `@P2`; returns its id, or no row (`OUTPUT INTO`, as in
/// [`HEARTBEAT`]).
pub(crate) const SEAL: &str = "
DECLARE @b TABLE (id bigint NOT NULL);
UPDATE {s}.batches WITH (ROWLOCK) SET sealed = 1
OUTPUT inserted.id INTO @b (id)
WHERE id = @P1 AND queue = @P2;
SELECT id FROM @b;";

/// Whether batch `@P1` of queue `@P2` is sealed, and its lowest stage with an
/// unfinished job: `MIN` over the prefix of `jobs_stage`, filtered to unfinished jobs
/// (the state list matches its filter), is one seek whatever the batch's size.
pub(crate) const REACHED: &str = "
SELECT b.sealed,
       (SELECT MIN(j.stage) FROM {s}.jobs AS j
        WHERE j.batch_id = b.id AND j.state IN ('ready', 'blocked', 'running', 'retrying'))
       AS lowest
FROM {s}.batches AS b
WHERE b.id = @P1 AND b.queue = @P2;";

/// Batch `@P1` of queue `@P2` and its jobs counted by (stage, state), in one
/// statement.
pub(crate) const BATCH_PROGRESS: &str = "
SELECT b.on_failure, b.sealed, b.failed, b.released_stage, c.stage, c.state, c.n,
       b.created_at, c.fin, b.name
FROM {s}.batches AS b
OUTER APPLY (SELECT j.stage, j.state, COUNT_BIG(*) AS n, MAX(j.finished_at) AS fin
             FROM {s}.jobs AS j
             WHERE j.batch_id = b.id GROUP BY j.stage, j.state) AS c
WHERE b.id = @P1 AND b.queue = @P2;";

/// Counts of queue `@P1` by state (ready but not yet due is `scheduled`), then its
/// settings.
pub(crate) const QUEUE_STATS: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
SELECT s.state, COUNT_BIG(*) AS n, MIN(s.due) AS oldest
FROM (SELECT CASE WHEN state = 'ready' AND run_at > @now THEN 'scheduled' ELSE state END
             AS state,
             CASE WHEN state IN ('ready', 'retrying') AND run_at <= @now THEN run_at END
             AS due
      FROM {s}.jobs WHERE queue = @P1) AS s
GROUP BY s.state;
SELECT paused, max_running FROM {s}.queues WHERE queue = @P1;";

/// The queues in use (SPEC M4): holding a job, a batch or a setting.
pub(crate) const QUEUES: &str = "
SELECT queue FROM {s}.jobs
UNION SELECT queue FROM {s}.batches
UNION SELECT queue FROM {s}.schedules
UNION SELECT queue FROM {s}.queues WHERE paused = 1 OR max_running IS NOT NULL
ORDER BY queue;";

/// Job `@P1` of queue `@P2`, then its log. The row is read under a held shared lock,
/// so no settle changes it before the log is read: both describe the same moment.
pub(crate) const JOB: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
BEGIN TRANSACTION;
SELECT id, CASE WHEN state = 'ready' AND run_at > @now THEN 'scheduled' ELSE state END
       AS state,
       payload, priority, run_at, attempts, max_attempts, group_key, batch_id, stage,
       dedupe_key, enqueued_by, created_at, finished_at, last_error, worker, started_at,
       progress
FROM {s}.jobs WITH (HOLDLOCK, ROWLOCK) WHERE id = @P1 AND queue = @P2;
SELECT attempt, worker, started_at, ended_at, outcome, error, output, claimed_at
FROM {s}.attempts WHERE job_id = @P1 ORDER BY seq;
COMMIT TRANSACTION;";

/// Running jobs of queue `@P1`.
pub(crate) const RUNNING: &str = "
SELECT id, worker, attempts, started_at, lease_expires_at, progress FROM {s}.jobs
WHERE queue = @P1 AND state = 'running' ORDER BY id;";

/// SPEC L7: stores each report of JSON `@P1` (`[{id, token, progress}]`) on its job
/// while the job is `running` under that token; returns the ids written. Each job
/// found by its primary key.
pub(crate) const PROGRESS: &str = "
DECLARE @w TABLE (id bigint);
UPDATE j SET progress = l.progress
OUTPUT inserted.id INTO @w (id)
FROM {s}.jobs AS j WITH (ROWLOCK)
JOIN OPENJSON(@P1) WITH (id bigint '$.id', token uniqueidentifier '$.token',
                        progress nvarchar(max) '$.progress') AS l
  ON j.id = l.id AND j.lease_token = l.token AND j.state = 'running';
SELECT id FROM @w;";

/// SPEC M6: the job of group `@P2` of queue `@P1` running or retrying, if one is.
pub(crate) const GROUP_HOLDER: &str = "
SELECT TOP (1) id FROM {s}.jobs
WHERE queue = @P1 AND group_key = @P2 AND state IN ('running', 'retrying');";

/// SPEC B9: the newest job id of queue `@P1`, and its batches with unfinished jobs.
pub(crate) const PURGE_BATCHES: &str = "
SELECT MAX(id) FROM {s}.jobs WHERE queue = @P1;
SELECT DISTINCT batch_id FROM {s}.jobs
WHERE queue = @P1 AND batch_id IS NOT NULL
  AND state IN ('ready', 'blocked', 'running', 'retrying');";

/// SPEC B9: up to 100 unfinished jobs of queue `@P1` in no batch, up to id `@P2`,
/// last in claim order first (a group's last before its head).
pub(crate) const PURGE_JOBS: &str = "
SELECT TOP (100) id FROM {s}.jobs
WHERE queue = @P1 AND batch_id IS NULL AND id <= @P2
  AND state IN ('ready', 'blocked', 'running', 'retrying')
ORDER BY priority DESC, run_at DESC, id DESC;";

/// SPEC B8: the leases of JSON `@P1` (`[{id, token}]`) whose job is not `running` under
/// that token; each job found by its primary key.
pub(crate) const LOST: &str = "
SELECT DISTINCT l.id FROM OPENJSON(@P1) WITH (id bigint '$.id', token uniqueidentifier '$.token') AS l
WHERE NOT EXISTS (SELECT 1 FROM {s}.jobs AS j
    WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running');";

/// The newest `@P2` batches of queue `@P1`.
pub(crate) const BATCH_IDS: &str =
    "SELECT TOP (@P2) id FROM {s}.batches WHERE queue = @P1 ORDER BY id DESC;";

/// Whether batch `@P1` is of queue `@P2`, then up to `@P4` of its job ids above `@P3`,
/// in order (SPEC M5).
pub(crate) const BATCH_JOB_IDS: &str = "
SELECT COUNT_BIG(*) FROM {s}.batches WHERE id = @P1 AND queue = @P2;
SELECT TOP (@P4) id FROM {s}.jobs WHERE batch_id = @P1 AND id > @P3 ORDER BY id;";

/// SPEC M7: jobs of queue `@P1` below id `@P2`, newest first, at most `@P10` of the
/// queue looked at; filters `@P3` state, `@P4` batch, `@P5` stage, `@P6` group, `@P7`
/// bytes in the payload or `@P8` text in the last error (byte for byte), each skipped
/// when NULL. Only the matches, and the row at the scan's bound, come back: at most
/// `@P9` rows.
pub(crate) const LIST_JOBS: &str = "
DECLARE @now datetime2(6) = SYSUTCDATETIME();
SELECT TOP (@P9) id, hit, place FROM (
    SELECT id, ROW_NUMBER() OVER (ORDER BY id DESC) AS place,
           CASE WHEN (@P3 IS NULL OR st = @P3)
                 AND (@P4 IS NULL OR batch_id = @P4)
                 AND (@P5 IS NULL OR stage = @P5)
                 AND (@P6 IS NULL OR group_key = @P6)
                 AND (@P7 IS NULL OR CHARINDEX(@P7, payload) > 0
                      OR CHARINDEX(@P8, last_error COLLATE Latin1_General_100_BIN2) > 0)
                THEN 1 ELSE 0 END AS hit
    FROM (SELECT TOP (@P10) id, batch_id, stage, group_key, payload, last_error,
                 CASE WHEN state = 'ready' AND run_at > @now THEN 'scheduled' ELSE state END
                 AS st
          FROM {s}.jobs WHERE queue = @P1 AND id < @P2 ORDER BY id DESC) AS scan
) AS w
WHERE hit = 1 OR place = @P10
ORDER BY id DESC;";

/// The oldest `@P2` dead jobs of queue `@P1`.
pub(crate) const DEAD_IDS: &str =
    "SELECT TOP (@P2) id FROM {s}.jobs WHERE queue = @P1 AND state = 'dead' ORDER BY id;";

/// Stores schedule `@P2` (a stored key) of queue `@P1` with definition `@P3`, or
/// replaces its definition, keeping its mark and pause (SPEC S1). A new one's mark is
/// `@P4`, or the server's time when NULL.
pub(crate) const SCHEDULE_PUT: &str = "
BEGIN TRANSACTION;
UPDATE {s}.schedules WITH (UPDLOCK, HOLDLOCK)
SET definition = @P3, version = version + 1
WHERE queue = @P1 AND name = @P2;
IF @@ROWCOUNT = 0
    INSERT INTO {s}.schedules (queue, name, definition, version, mark, paused)
    VALUES (@P1, @P2, @P3, 1, ISNULL(@P4, SYSUTCDATETIME()), 0);
COMMIT TRANSACTION;";

/// The schedules of queue `@P1`, then the server's time.
pub(crate) const SCHEDULE_LIST: &str = "
SELECT name, definition, version, mark, paused, last_slot, last_job, last_batch
FROM {s}.schedules WHERE queue = @P1 ORDER BY name;
SELECT SYSUTCDATETIME() AS now;";

/// Pauses (`@P3` = 1) or resumes schedule `@P2` of queue `@P1`; how many rows matched.
pub(crate) const SCHEDULE_PAUSE: &str = "
UPDATE {s}.schedules SET paused = @P3 WHERE queue = @P1 AND name = @P2;
SELECT @@ROWCOUNT AS n;";

/// Deletes schedule `@P2` of queue `@P1`; how many rows it deleted.
pub(crate) const SCHEDULE_DELETE: &str = "
DELETE FROM {s}.schedules WHERE queue = @P1 AND name = @P2;
SELECT @@ROWCOUNT AS n;";

/// The start of [`fire`]: `@P3` schedule (as stored), `@P4` version, `@P5` slot (NULL:
/// run now), `@P6` the batch's on_failure (NULL: none), `@P7` its name (the schedule's). Locks the schedule's row, skipping it
/// when another scheduler holds it, checks it, and opens the slot's batch. The first
/// result set is the verdict: NULL to go on, else why not, and the batch.
const FIRE_GATE: &str = "
DECLARE @fv bigint = NULL;
DECLARE @fm datetime2(6) = NULL;
DECLARE @fp bit = NULL;
DECLARE @fwhy varchar(8) = NULL;
DECLARE @fb bigint = NULL;
BEGIN TRANSACTION;
-- A slot locks the row, skipping it when another scheduler holds it; a run now
-- changes nothing of the row and only reads it.
IF @P5 IS NULL
    SELECT @fv = version, @fm = mark, @fp = paused
    FROM {s}.schedules WITH (READCOMMITTEDLOCK)
    WHERE queue = @P1 AND name = @P3;
ELSE
    SELECT @fv = version, @fm = mark, @fp = paused
    FROM {s}.schedules WITH (UPDLOCK, ROWLOCK, READPAST, READCOMMITTEDLOCK)
    WHERE queue = @P1 AND name = @P3;
IF @fv IS NULL
    SET @fwhy = CASE WHEN EXISTS (SELECT 1 FROM {s}.schedules WITH (NOLOCK)
                                  WHERE queue = @P1 AND name = @P3)
                     THEN 'busy' ELSE 'gone' END;
ELSE IF @fv <> @P4 SET @fwhy = 'changed';
ELSE IF @P5 IS NOT NULL AND @fp = 1 SET @fwhy = 'paused';
ELSE IF @P5 IS NOT NULL AND @fm >= @P5 SET @fwhy = 'taken';
ELSE IF @P5 IS NOT NULL AND @P5 > SYSUTCDATETIME() SET @fwhy = 'notdue';
IF @fwhy IS NOT NULL
BEGIN
    ROLLBACK TRANSACTION;
    SELECT @fwhy AS why, @fb AS batch;
    RETURN;
END;
IF @P6 IS NOT NULL AND EXISTS (SELECT 1 FROM OPENJSON(@P2))
BEGIN
    INSERT INTO {s}.batches (queue, on_failure, sealed, failed, created_at, name)
    VALUES (@P1, @P6, 0, 0, SYSUTCDATETIME(), @P7);
    SET @fb = SCOPE_IDENTITY();
END;
SELECT @fwhy AS why, @fb AS batch;";

/// The end of [`fire`], before the enqueue's commit: seals the slot's batch and moves
/// the mark with the record of what the slot made.
const FIRE_END: &str = "
IF @fb IS NOT NULL UPDATE {s}.batches SET sealed = 1 WHERE id = @fb;
IF @P5 IS NOT NULL
    UPDATE {s}.schedules
    SET mark = @P5,
        last_slot = CASE WHEN EXISTS (SELECT 1 FROM @in) THEN @P5 ELSE last_slot END,
        last_job = CASE WHEN EXISTS (SELECT 1 FROM @in) THEN (SELECT MIN(id) FROM @ins)
                        ELSE last_job END,
        last_batch = CASE WHEN EXISTS (SELECT 1 FROM @in) THEN @fb ELSE last_batch END
    WHERE queue = @P1 AND name = @P3;
";

/// Fires one slot (SPEC S2) in one batch and one transaction: [`FIRE_GATE`], then
/// [`ENQUEUE`] (its transaction nested in the gate's) with every job put in the
/// slot's batch, then [`FIRE_END`] before the commits. Result sets: the verdict, then
/// the enqueue's.
pub(crate) static FIRE: std::sync::LazyLock<String> = std::sync::LazyLock::new(fire);

fn fire() -> String {
    let begin = "BEGIN TRANSACTION;\nINSERT INTO @tb";
    let commit = "\nCOMMIT TRANSACTION;";
    assert!(ENQUEUE.contains(begin) && ENQUEUE.contains(commit));
    let (body, events) = ENQUEUE.rsplit_once(commit).expect("checked");
    let body = body.replacen(
        begin,
        &format!("UPDATE @in SET batch = @fb WHERE @fb IS NOT NULL;\n{begin}"),
        1,
    );
    format!("{FIRE_GATE}{body}{FIRE_END}COMMIT TRANSACTION;{commit}{events}")
}

/// Every statement, built ones included, for the parse test.
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, &'static str)> {
    let mut all = ALL.to_vec();
    all.push(("FIRE", FIRE.as_str()));
    all
}

/// Every statement template, for the parse test.
#[cfg(test)]
pub(crate) const ALL: &[(&str, &str)] = &[
    ("SESSION", SESSION),
    ("MIGRATE_BEGIN", MIGRATE_BEGIN),
    ("MIGRATE_RECORD", MIGRATE_RECORD),
    ("MIGRATE_COMMIT", MIGRATE_COMMIT),
    ("PING", PING),
    ("TRANCOUNT", TRANCOUNT),
    ("MIGRATION_1", MIGRATIONS[0]),
    ("MIGRATION_2", MIGRATIONS[1]),
    ("MIGRATION_3", MIGRATIONS[2]),
    ("MIGRATION_4", MIGRATIONS[3]),
    ("MIGRATION_5", MIGRATIONS[4]),
    ("MIGRATION_6", MIGRATIONS[5]),
    ("MIGRATION_7", MIGRATIONS[6]),
    ("MIGRATION_8", MIGRATIONS[7]),
    ("RUN_NOW", RUN_NOW),
    ("CLAIM", CLAIM),
    ("SETTLE", SETTLE),
    ("HEARTBEAT", HEARTBEAT),
    ("ENQUEUE", ENQUEUE),
    ("CANCEL_JOB", CANCEL_JOB),
    ("CANCEL_BATCH", CANCEL_BATCH),
    ("RETRY_DEAD", RETRY_DEAD),
    ("EXPIRE", EXPIRE),
    ("PRUNE", PRUNE),
    ("PRUNE_BATCHES", PRUNE_BATCHES),
    ("SET_QUEUE", SET_QUEUE),
    ("OPEN_BATCH", OPEN_BATCH),
    ("SEAL", SEAL),
    ("REACHED", REACHED),
    ("BATCH_PROGRESS", BATCH_PROGRESS),
    ("QUEUE_STATS", QUEUE_STATS),
    ("QUEUES", QUEUES),
    ("JOB", JOB),
    ("RUNNING", RUNNING),
    ("LOST", LOST),
    ("GROUP_HOLDER", GROUP_HOLDER),
    ("PURGE_BATCHES", PURGE_BATCHES),
    ("PURGE_JOBS", PURGE_JOBS),
    ("PROGRESS", PROGRESS),
    ("BATCH_IDS", BATCH_IDS),
    ("BATCH_JOB_IDS", BATCH_JOB_IDS),
    ("DEAD_IDS", DEAD_IDS),
    ("LIST_JOBS", LIST_JOBS),
    ("DELETE_JOBS", DELETE_JOBS),
    ("WORKER_BEAT", WORKER_BEAT),
    ("WORKERS", WORKERS),
    ("SCHEDULE_PUT", SCHEDULE_PUT),
    ("SCHEDULE_LIST", SCHEDULE_LIST),
    ("SCHEDULE_PAUSE", SCHEDULE_PAUSE),
    ("SCHEDULE_DELETE", SCHEDULE_DELETE),
];

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlparser::{ast::Statement, dialect::MsSqlDialect, parser::Parser};

    use super::*;
    use crate::schema::schema;

    /// `template` as it is sent for schema `relayq` (and the default lock timeout).
    fn filled(template: &str) -> String {
        let sql = schema("relayq").unwrap().fill(template);
        migrate_begin(&sql, migrate_lock_timeout(Duration::from_secs(30)))
    }

    fn parse(sql: &str) -> Vec<Statement> {
        Parser::parse_sql(&MsSqlDialect {}, sql).unwrap_or_else(|e| panic!("{e}\n{sql}"))
    }

    /// Whitespace runs as one space, so multi-line text can be searched for.
    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn every_statement_parses_as_tsql() {
        let mut failed = Vec::new();
        for (name, template) in all() {
            let sql = filled(template);
            assert!(!sql.contains('{') && !sql.contains('}'), "{name}");
            if let Err(e) = Parser::parse_sql(&MsSqlDialect {}, &sql) {
                failed.push(format!("{name}: {e}"));
            }
        }
        assert!(
            failed.is_empty(),
            "T-SQL that does not parse:\n{}",
            failed.join("\n")
        );
    }

    #[test]
    fn the_halt_logs_the_core_s_words() {
        let halt = format!("N'{}'", relayq_core::cancelled_by::HALT);
        assert!(SETTLE.contains(&halt), "{halt}");
    }

    #[test]
    fn every_migration_is_in_the_parse_test() {
        let listed = all()
            .into_iter()
            .filter(|(n, _)| n.starts_with("MIGRATION_"));
        assert_eq!(listed.count(), MIGRATIONS.len());
    }

    #[test]
    fn the_parser_rejects_broken_tsql() {
        // The test above can fail: a slip of the kind it guards against is caught.
        for broken in [
            "SELECT TOP (@P1 id FROM [relayq].jobs;",
            "UPDATE c SET state = 'running' OUTPUT inserted.id INTO;",
            "BEGIN TRANSACTION; SELECT FROM;",
        ] {
            assert!(
                Parser::parse_sql(&MsSqlDialect {}, broken).is_err(),
                "{broken}"
            );
        }
    }

    #[test]
    fn write_batches_commit_what_they_begin() {
        for (name, sql) in all() {
            let begins = sql.matches("BEGIN TRANSACTION").count();
            let ends = sql.matches("COMMIT TRANSACTION").count();
            if !name.starts_with("MIGRATE_") {
                assert_eq!(begins, ends, "{name}");
            }
        }
    }

    /// Review item 1: migration 2 turns lock escalation off on every table migration 1
    /// creates, each step guarded so that running it again changes nothing.
    #[test]
    fn lock_escalation_is_disabled_on_every_table_idempotently() {
        let tables: Vec<&str> = MIGRATIONS[0]
            .split("CREATE TABLE {s}.")
            .skip(1)
            .map(|rest| rest.split([' ', '(']).next().unwrap())
            .collect();
        assert_eq!(tables, ["jobs", "attempts", "queues", "batches"]);
        let m2 = squash(MIGRATIONS[1]);
        for t in tables {
            let step = format!(
                "IF EXISTS (SELECT 1 FROM sys.tables WHERE object_id = OBJECT_ID(N'{{s}}.{t}') \
                 AND lock_escalation <> 1) ALTER TABLE {{s}}.{t} SET (LOCK_ESCALATION = DISABLE);"
            );
            assert!(m2.contains(&step), "{t}: {m2}");
        }
    }

    /// Review item 2: the claim's read names its index and a seek, with the locking
    /// hints that make it skip other claimers' rows.
    #[test]
    fn the_claim_pins_jobs_claim_with_a_seek_and_its_lock_hints() {
        let sql = squash(&filled(CLAIM));
        let head = "SELECT TOP (@n) * FROM [relayq].jobs WITH (";
        let start = sql.find(head).expect("the claim's CTE") + head.len();
        let hints: Vec<&str> = sql[start..]
            .split_once(") WHERE")
            .expect("hints, then the WHERE")
            .0
            .split(", ")
            .collect();
        assert_eq!(
            hints,
            [
                "INDEX(jobs_claim)",
                "FORCESEEK",
                "ROWLOCK",
                "UPDLOCK",
                "READPAST",
                "READCOMMITTEDLOCK"
            ]
        );
        // The hinted index exists, and its filter is the claim's state list.
        let index = squash(MIGRATIONS[0]);
        assert!(index.contains(
            "CREATE INDEX jobs_claim ON {s}.jobs (queue, priority, run_at, id) \
             INCLUDE (state, lease_expires_at, attempts, max_attempts) \
             WHERE state IN ('ready', 'retrying', 'running');"
        ));
        assert!(sql.contains("WHERE queue = @P1 AND state IN ('ready', 'retrying', 'running')"));
    }

    /// Review item 3: the doomed check reads past locked rows; the `max_running`
    /// count must not (see [`CLAIM`]) and stays a locking read.
    #[test]
    fn the_claim_reads_past_locks_only_where_skipping_is_harmless() {
        let sql = squash(CLAIM);
        assert!(sql.contains(
            "IF EXISTS (SELECT 1 FROM {s}.jobs WITH (READPAST, READCOMMITTEDLOCK) \
             WHERE queue = @P1 AND state = 'running' AND lease_expires_at <= @now \
             AND attempts >= max_attempts) SET @doomed = 1;"
        ));
        let count = sql
            .split("SELECT @running = COUNT(*) FROM {s}.jobs ")
            .nth(1)
            .expect("the max_running count");
        assert!(
            count.starts_with("WITH (READCOMMITTEDLOCK) WHERE"),
            "{count}"
        );
        assert!(!sql.contains("{s}.queues WITH (READPAST"), "{sql}");
    }

    /// Review item 5: a batch that fails after its `COMMIT` would be run again by the
    /// deadlock retry and repeat committed work (a claim would lease jobs nobody
    /// gets). So nothing after a batch's last `COMMIT` reads or writes a queue table:
    /// only table variables and variables, which take no locks.
    #[test]
    fn nothing_after_a_commit_touches_a_queue_table() {
        let mut checked = 0;
        for (name, sql) in all()
            .into_iter()
            .filter(|(n, _)| !n.starts_with("MIGRATE_"))
        {
            if let Some((_, after)) = sql.rsplit_once("COMMIT TRANSACTION;") {
                assert!(!after.contains("{s}."), "{name}: {after}");
                checked += 1;
            }
        }
        assert!(checked >= 10, "{checked}");
    }

    /// Every `OUTPUT` clause of a statement, and whether it has an `INTO`, from the
    /// parsed statement (the AST's `OutputClause::Output { into_table, .. }`).
    fn outputs(sql: &str) -> (usize, usize) {
        let ast = format!("{:?}", parse(sql));
        let with_into = ast.matches("into_table: Some(").count();
        let without = ast.matches("into_table: None").count();
        (with_into, without)
    }

    /// Review item 6: no statement returns `OUTPUT` rows straight to the client
    /// (error 334 once the table has a trigger).
    #[test]
    fn every_output_clause_goes_into_a_table_variable() {
        for (name, template) in all() {
            let (_, without) = outputs(&filled(template));
            assert_eq!(without, 0, "{name} has an OUTPUT without INTO");
        }
        for name in ["HEARTBEAT", "SEAL", "OPEN_BATCH", "CLAIM", "SETTLE"] {
            let (_, sql) = ALL.iter().find(|(n, _)| *n == name).unwrap();
            assert!(outputs(&filled(sql)).0 >= 1, "{name} has no OUTPUT INTO");
        }
    }

    #[test]
    fn an_output_without_into_is_detected() {
        let bad = [
            "UPDATE [relayq].jobs SET state = 'x' OUTPUT inserted.id WHERE id = 1;",
            "INSERT INTO [relayq].batches (queue) OUTPUT inserted.id VALUES (N'q');",
        ];
        for sql in bad {
            assert_eq!(outputs(sql), (0, 1), "{sql}");
        }
        let good = "DECLARE @b TABLE (id bigint); \
                    UPDATE [relayq].jobs SET state = 'x' OUTPUT inserted.id INTO @b (id) WHERE id = 1;";
        assert_eq!(outputs(good), (1, 0));
    }

    /// Review item 4: a migrator waiting for another one's lock is answered by the
    /// server before tiberius's command timeout fires.
    #[test]
    fn the_migration_lock_timeout_is_below_the_command_timeout() {
        assert_eq!(migrate_lock_timeout(Duration::from_secs(30)), 22_500);
        for secs in [1, 5, 30, 60, 600, 86_400] {
            let command = Duration::from_secs(secs);
            let lock = migrate_lock_timeout(command);
            assert!(lock > 0, "{secs}");
            assert!(
                u128::try_from(lock).unwrap() < command.as_millis(),
                "{secs}"
            );
        }
        assert_eq!(
            migrate_lock_timeout(Duration::ZERO),
            0,
            "0 is no wait, not -1"
        );
        assert_eq!(migrate_lock_timeout(Duration::MAX), i32::MAX);
        let begin = squash(&filled(MIGRATE_BEGIN));
        assert!(
            begin.starts_with("SET LOCK_TIMEOUT 22500; BEGIN TRANSACTION;"),
            "{begin}"
        );
        assert!(begin.contains("@LockOwner = 'Transaction', @LockTimeout = 22500;"));
        assert!(MIGRATE_COMMIT.ends_with("SET LOCK_TIMEOUT -1;"));
    }
}
