//! The tables, and their migrations under `GET_LOCK` (MySQL's DDL commits as it goes,
//! so a migration cannot be one transaction: a named lock keeps two processes from
//! running one at once, and the version row says how far the last one got).
//!
//! Times are microseconds since the Unix epoch (UTC) in `BIGINT`s, read from the
//! server's clock. Text is in a binary collation without padding: queue names, groups
//! and keys compare byte by byte, as on every other backend (MySQL's default
//! collations fold case, and `utf8mb4_bin` ignores trailing spaces).
//!
//! MySQL has no partial index. Each index that another backend keeps partial is here
//! over a stored generated column that is `NULL` outside the states the index is for,
//! so that its equality prefix picks exactly those rows and its order is the claim's:
//! `claim_queue` is the queue of a `ready` or `retrying` job, and the claim reads
//! `(claim_queue, priority, run_at, id)` from the queue's head, with `LIMIT` stopping
//! it early and nothing sorted.

use relayq_core::{Result, kit::schema};
use sqlx::{Connection, MySqlConnection};

use crate::db;

/// The statements of each migration, in order; `relayq_schema.version` records how
/// many migrations ran.
pub(crate) const MIGRATIONS: &[&[&str]] = &[
    &[
        "CREATE TABLE IF NOT EXISTS relayq_schema (
        id      TINYINT NOT NULL PRIMARY KEY,
        version INT     NOT NULL
    ) ENGINE = InnoDB",
        "CREATE TABLE IF NOT EXISTS relayq_jobs (
        id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        queue            VARCHAR(128) NOT NULL,
        state            VARCHAR(16)  NOT NULL,
        payload          LONGBLOB     NOT NULL,
        priority         BIGINT       NOT NULL,
        run_at           BIGINT       NOT NULL,
        max_attempts     BIGINT       NOT NULL,
        attempts         BIGINT       NOT NULL DEFAULT 0,
        -- The attempts a job was enqueued with, kept from its first dead retry on
        -- (SPEC M2).
        budget           BIGINT,
        group_key        VARCHAR(255),
        batch_id         BIGINT,
        stage            BIGINT,
        dedupe_key       VARCHAR(255),
        enqueued_by      VARCHAR(255),
        created_at       BIGINT       NOT NULL,
        finished_at      BIGINT,
        last_error       MEDIUMTEXT,
        progress         MEDIUMTEXT,
        -- The running attempt: its lease and where it runs.
        lease_token      BINARY(16),
        lease_expires_at BIGINT,
        worker           VARCHAR(255),
        started_at       BIGINT,
        -- The claim index's prefix: the queue of a claimable job.
        claim_queue  VARCHAR(128) GENERATED ALWAYS AS
            (CASE WHEN state IN ('ready', 'retrying') THEN queue END) STORED,
        -- The queue of a running job: expiry and running counts.
        running_queue VARCHAR(128) GENERATED ALWAYS AS
            (CASE WHEN state = 'running' THEN queue END) STORED,
        -- The group of an unfinished job.
        live_group   VARCHAR(255) GENERATED ALWAYS AS
            (CASE WHEN state IN ('ready', 'blocked', 'running', 'retrying')
             THEN group_key END) STORED,
        -- The group of a job that holds it or is about to (ready, running, retrying).
        holding_group VARCHAR(255) GENERATED ALWAYS AS
            (CASE WHEN state IN ('ready', 'running', 'retrying') THEN group_key END) STORED,
        -- The batch of an unfinished job.
        live_batch   BIGINT GENERATED ALWAYS AS
            (CASE WHEN state IN ('ready', 'blocked', 'running', 'retrying')
             THEN batch_id END) STORED,
        -- The dedupe key of an unfinished job (SPEC E3): unique per queue.
        live_dedupe  VARCHAR(255) GENERATED ALWAYS AS
            (CASE WHEN state IN ('ready', 'blocked', 'running', 'retrying')
             THEN dedupe_key END) STORED,
        KEY relayq_jobs_claim (claim_queue, priority, run_at, id),
        KEY relayq_jobs_running (running_queue, lease_expires_at),
        KEY relayq_jobs_group (queue, live_group, priority, run_at, id),
        KEY relayq_jobs_holder (queue, holding_group, state),
        KEY relayq_jobs_stage (live_batch, stage),
        KEY relayq_jobs_batch (batch_id, id),
        UNIQUE KEY relayq_jobs_dedupe (queue, live_dedupe),
        KEY relayq_jobs_state (queue, state, finished_at),
        KEY relayq_jobs_list (queue, id)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        // The execution log: one row per ended attempt (the running one lives on the job).
        "CREATE TABLE IF NOT EXISTS relayq_attempts (
        id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        job_id     BIGINT       NOT NULL,
        attempt    BIGINT       NOT NULL,
        worker     VARCHAR(255) NOT NULL,
        started_at BIGINT       NOT NULL,
        ended_at   BIGINT       NOT NULL,
        outcome    VARCHAR(16)  NOT NULL,
        error      MEDIUMTEXT,
        output     MEDIUMTEXT,
        claimed_at BIGINT,
        KEY relayq_attempts_job (job_id, id)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        // One row per queue that was ever written: its settings, and the lock every write
        // to the queue takes first (see `lib.rs`).
        "CREATE TABLE IF NOT EXISTS relayq_queues (
        queue       VARCHAR(128) NOT NULL PRIMARY KEY,
        paused      BOOLEAN      NOT NULL DEFAULT FALSE,
        max_running BIGINT
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        "CREATE TABLE IF NOT EXISTS relayq_batches (
        id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        queue          VARCHAR(128) NOT NULL,
        name           VARCHAR(255),
        on_failure     VARCHAR(16)  NOT NULL,
        sealed         BOOLEAN      NOT NULL DEFAULT FALSE,
        failed         BOOLEAN      NOT NULL DEFAULT FALSE,
        -- High-water mark of released stages (SPEC B3).
        released_stage BIGINT,
        created_at     BIGINT       NOT NULL,
        KEY relayq_batches_queue (queue, id)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        // Schedules (SPEC S): `mark` is the last slot handled; a slot fires only by moving
        // it forward, in the transaction that stores the slot's jobs.
        "CREATE TABLE IF NOT EXISTS relayq_schedules (
        queue      VARCHAR(128) NOT NULL,
        name       VARCHAR(255) NOT NULL,
        definition MEDIUMTEXT   NOT NULL,
        version    BIGINT       NOT NULL,
        mark       BIGINT       NOT NULL,
        paused     BOOLEAN      NOT NULL DEFAULT FALSE,
        last_slot  BIGINT,
        last_job   BIGINT,
        last_batch BIGINT,
        PRIMARY KEY (queue, name)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        // Each worker's last beat to a queue it serves (SPEC M9).
        "CREATE TABLE IF NOT EXISTS relayq_workers (
        queue     VARCHAR(128) NOT NULL,
        name      VARCHAR(255) NOT NULL,
        beat      MEDIUMTEXT   NOT NULL,
        last_seen BIGINT       NOT NULL,
        PRIMARY KEY (queue, name)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
    ],
    &[
        // SPEC D: dependencies between jobs of one batch. Each edge says a child runs after
        // a parent; the key leads with the parent, which a settle looks up. A job's
        // `deps_left` counts its parents not yet finished: a child becomes ready only at 0
        // (and when its stage and group allow).
        "CREATE TABLE IF NOT EXISTS relayq_job_deps (
        parent_id BIGINT NOT NULL,
        child_id  BIGINT NOT NULL,
        PRIMARY KEY (parent_id, child_id),
        KEY relayq_job_deps_child (child_id, parent_id)
    ) ENGINE = InnoDB",
        "ALTER TABLE relayq_jobs
        ADD COLUMN deps_left BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN after_failure VARCHAR(8)",
        "ALTER TABLE relayq_batches
        ADD COLUMN after_failure VARCHAR(8) NOT NULL DEFAULT 'cancel'",
        // A queue's rate (SPEC K8): at most rate_count starts per rate_per_us microseconds,
        // rate_burst of them at once; rate_tat is when the next start is due in the generic
        // cell rate algorithm (microseconds since the epoch, NULL before the first).
        "ALTER TABLE relayq_queues
        ADD COLUMN rate_count BIGINT,
        ADD COLUMN rate_per_us BIGINT,
        ADD COLUMN rate_burst BIGINT,
        ADD COLUMN rate_tat BIGINT",
    ],
    &[
        // Limit keys (SPEC K). A job's key, and whether a claim set it aside ("parked")
        // because its key was full: a parked job leaves the claim index, so claims stop
        // reading a full key's waiting jobs, however many there are (SPEC K4).
        "ALTER TABLE relayq_jobs
            ADD COLUMN limit_key VARCHAR(255),
            ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE",
        // The claim index's prefix leaves parked jobs out; the key of a parked waiting
        // job finds the earliest one to put back, that of an unparked one the jobs an
        // enqueue counts ahead of its own; running jobs are counted per key.
        "ALTER TABLE relayq_jobs
            DROP INDEX relayq_jobs_claim,
            DROP COLUMN claim_queue,
            ADD COLUMN claim_queue VARCHAR(128) GENERATED ALWAYS AS
                (CASE WHEN state IN ('ready', 'retrying') AND NOT parked THEN queue END) STORED,
            ADD COLUMN parked_key VARCHAR(255) GENERATED ALWAYS AS
                (CASE WHEN state IN ('ready', 'retrying') AND parked THEN limit_key END) STORED,
            ADD COLUMN waiting_key VARCHAR(255) GENERATED ALWAYS AS
                (CASE WHEN state IN ('ready', 'retrying') AND NOT parked THEN limit_key END)
                STORED,
            ADD KEY relayq_jobs_key_waiting (queue, waiting_key, priority, run_at, id),
            ADD KEY relayq_jobs_claim (claim_queue, priority, run_at, id),
            ADD KEY relayq_jobs_parked (queue, parked_key, priority, run_at, id),
            ADD KEY relayq_jobs_key_running (running_queue, limit_key)",
        // The limit of every key without one of its own, and whether the queue has
        // key limits at all (its claims then count keys).
        // The rate of every key without one of its own (SPEC K12), as a queue's rate is
        // stored; `keyed` says the queue has key limits or key rates at all, and
        // `key_rated` key rates (its claims then count keys, or judge their rates).
        "ALTER TABLE relayq_queues
            ADD COLUMN key_limit BIGINT,
            ADD COLUMN key_rate_count BIGINT,
            ADD COLUMN key_rate_per_us BIGINT,
            ADD COLUMN key_rate_burst BIGINT,
            ADD COLUMN keyed BOOLEAN NOT NULL DEFAULT FALSE,
            ADD COLUMN key_rated BOOLEAN NOT NULL DEFAULT FALSE",
        // Every write to the queue counts itself here, under the row lock it holds:
        // handles poll the counts to wake their subscribers (`listen.rs`).
        "ALTER TABLE relayq_queues ADD COLUMN changes BIGINT NOT NULL DEFAULT 0",
        // One row per key that has a rate: its own (NULL under the default), when its
        // next start is due (`tat`), and when a claim that parked its jobs for the rate
        // set them to go back (`wake_at`).
        "CREATE TABLE IF NOT EXISTS relayq_key_rates (
            queue       VARCHAR(128) NOT NULL,
            limit_key   VARCHAR(255) NOT NULL,
            rate_count  BIGINT,
            rate_per_us BIGINT,
            rate_burst  BIGINT,
            tat         BIGINT,
            wake_at     BIGINT,
            PRIMARY KEY (queue, limit_key),
            KEY relayq_key_rates_wake (queue, wake_at)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
        "CREATE TABLE IF NOT EXISTS relayq_key_limits (
            queue     VARCHAR(128) NOT NULL,
            limit_key VARCHAR(255) NOT NULL,
            max       BIGINT       NOT NULL,
            PRIMARY KEY (queue, limit_key)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = {collate}",
    ],
];

/// The version this code writes and reads.
pub(crate) const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// How long a process waits for another one's migration.
const MIGRATE_LOCK_SECS: i64 = 60;

/// The version recorded in the database the connection uses, `None` when no migration
/// ever ran there.
pub(crate) async fn version(c: &mut MySqlConnection) -> Result<Option<usize>> {
    let table: Option<String> = sqlx::query_scalar(
        "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'relayq_schema'",
    )
    .fetch_optional(&mut *c)
    .await
    .map_err(db)?;
    if table.is_none() {
        return Ok(None);
    }
    let v: Option<i32> = sqlx::query_scalar("SELECT version FROM relayq_schema WHERE id = 1")
        .fetch_optional(&mut *c)
        .await
        .map_err(db)?;
    Ok(v.map(|v| usize::try_from(v).unwrap_or(0)))
}

/// Runs the migrations not yet run, holding a named lock for the database so that
/// processes opening it at once take turns; each migration's version is recorded as
/// soon as its statements ran.
pub(crate) async fn migrate(c: &mut MySqlConnection, name: &str) -> Result<()> {
    let lock = format!("relayq_migrate.{name}");
    // Hashed: MySQL refuses a lock name over 64 characters.
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(SHA1(?), ?)")
        .bind(&lock)
        .bind(MIGRATE_LOCK_SECS)
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    if got != Some(1) {
        return Err(relayq_core::Error::transient(format!(
            "another process held the migration lock of {name} for {MIGRATE_LOCK_SECS} s"
        )));
    }
    let ran = run(c, name).await;
    let released = sqlx::query("DO RELEASE_LOCK(SHA1(?))")
        .bind(&lock)
        .execute(&mut *c)
        .await
        .map_err(db);
    ran.and(released.map(|_| ()))
}

async fn run(c: &mut MySqlConnection, name: &str) -> Result<()> {
    let collate = collation(c).await?;
    let applied = version(c).await?.unwrap_or(0);
    for (i, statements) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(schema::pending(name, applied, SCHEMA_VERSION)?.start)
    {
        for sql in *statements {
            let sql = sql.replace("{collate}", collate);
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *c)
                .await
            {
                // A column a migration cut short had added already (MySQL has no `ADD
                // COLUMN IF NOT EXISTS`; tables are made `IF NOT EXISTS`).
                Err(e) if duplicate_column(&e) => {}
                done => {
                    done.map_err(db)?;
                }
            }
        }
        sqlx::query(
            "INSERT INTO relayq_schema (id, version) VALUES (1, ?)
             ON DUPLICATE KEY UPDATE version = VALUES(version)",
        )
        .bind(i32::try_from(i + 1).unwrap_or(i32::MAX))
        .execute(&mut *c)
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// MySQL's "duplicate column name" (1060).
fn duplicate_column(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| d.number() == 1060)
}

/// The binary collation without trailing-space padding: under `utf8mb4_bin` (a `PAD
/// SPACE` collation) `'g'` equals `'g '`, so two groups or dedupe keys that differ by a
/// trailing space would be one. MariaDB and MySQL name it differently.
async fn collation(c: &mut MySqlConnection) -> Result<&'static str> {
    let version: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
        .fetch_one(&mut *c)
        .await
        .map_err(db)?;
    Ok(if version.contains("MariaDB") {
        "utf8mb4_nopad_bin"
    } else {
        "utf8mb4_0900_bin"
    })
}

/// For a handle that does not migrate: `Error::Schema` unless the database is at
/// [`SCHEMA_VERSION`].
pub(crate) async fn check(c: &mut MySqlConnection, name: &str) -> Result<()> {
    let found = version(c).await?;
    schema::check(name, found, SCHEMA_VERSION)
}

/// Closes a connection used for set-up, ignoring a failure to say goodbye.
pub(crate) async fn close(c: MySqlConnection) {
    let _ = c.close().await;
}
