//! The schema relayq lives in: its name, the statements written for it, and the
//! migrations that create it.

use std::{sync::Arc, time::Duration};

use relayq_core::{
    Error, Result,
    kit::{Statements, schema},
};
use sqlx::{AssertSqlSafe, PgPool};

use crate::db;

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "relayq";

/// The migrations, one entry per version; `{s}` stands for the quoted schema name.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_succeeded_attempt.sql"),
    include_str!("../migrations/0003_group_holder.sql"),
    include_str!("../migrations/0004_claim_scan.sql"),
    include_str!("../migrations/0005_settle_groups.sql"),
    include_str!("../migrations/0006_group_scans.sql"),
    include_str!("../migrations/0007_schedules.sql"),
    include_str!("../migrations/0008_progress.sql"),
    include_str!("../migrations/0009_workers.sql"),
    include_str!("../migrations/0010_budget_and_batch_name.sql"),
    include_str!("../migrations/0011_claimed_at.sql"),
    include_str!("../migrations/0012_limit_keys.sql"),
    include_str!("../migrations/0013_rates.sql"),
    include_str!("../migrations/0014_key_rates.sql"),
    include_str!("../migrations/0015_park_at_enqueue.sql"),
    include_str!("../migrations/0016_dependencies.sql"),
];

/// The schema version this crate migrates to. [`migrate`](crate::PostgresBackend::migrate)
/// refuses a schema at a newer one, so processes sharing a schema must agree on it (the
/// test suites name their schemas after it, so a server used by two versions keeps them
/// apart).
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// A validated schema name and the statements of this crate, written for it (core's
/// [`Statements`]: `{s}` is the quoted schema, values are always bound, SPEC X2).
#[derive(Debug)]
pub(crate) struct Schema {
    statements: Statements,
    name: String,
    quoted: String,
}

impl Schema {
    /// Checks `name` (core's rules), so it needs no escaping and leaves room for the
    /// notification channel's name.
    pub(crate) fn new(name: &str) -> Result<Self> {
        Ok(Self {
            statements: Statements::new(name, |n| format!("\"{n}\""))?,
            name: name.to_owned(),
            quoted: format!("\"{name}\""),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The notification channel of this schema.
    pub(crate) fn channel(&self) -> String {
        format!("relayq_{}", self.name)
    }

    /// `template` with the schema filled in, ready for `sqlx::query`.
    pub(crate) fn sql(&self, template: &'static str) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(self.statements.sql(template))
    }

    /// `template` with the schema filled in and `{limit}` replaced by `limit`.
    ///
    /// A `LIMIT $n` is a trap for cached statements: PostgreSQL's generic plan, which it
    /// may switch to after five executions, cannot see `$n` and assumes a tenth of the
    /// table comes back, so on a large table whose rows are no longer in index order it
    /// can pick a sequential scan and a sort. A literal limit keeps every plan's estimate
    /// honest. It costs one prepared statement per distinct limit and connection, so
    /// callers round limits to a few values (the claim: powers of two).
    pub(crate) fn sql_limit(&self, template: &'static str, limit: u32) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(self.statements.sql_limit(template, limit))
    }

    fn fill(&self, template: &str) -> String {
        self.statements.fill(template)
    }

    /// Applies the migrations not yet applied, in one transaction under an advisory
    /// transaction lock per schema, so processes starting together apply each once.
    pub(crate) async fn migrate(&self, pool: &PgPool, lock_timeout: Duration) -> Result<()> {
        let mut tx = pool.begin().await.map_err(db)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('relayq migrate ' || $1, 0))")
            .bind(&self.name)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let setup = self.fill(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.migrations (
                 version    integer     PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now());",
        );
        sqlx::raw_sql(AssertSqlSafe(setup))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let applied: i32 =
            sqlx::query_scalar(self.sql("SELECT COALESCE(max(version), 0) FROM {s}.migrations"))
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
        let pending = schema::pending(&self.name, version(applied), MIGRATIONS.len())?;
        // Only for the migrations themselves: they may alter tables the workers use.
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(format!("{}ms", lock_timeout.as_millis()))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        for i in pending {
            sqlx::raw_sql(AssertSqlSafe(self.fill(MIGRATIONS[i])))
                .execute(&mut *tx)
                .await
                .map_err(|e| self.lock_not_granted(e, lock_timeout))?;
            sqlx::query(self.sql("INSERT INTO {s}.migrations (version) VALUES ($1)"))
                .bind(i32::try_from(i + 1).map_err(Error::backend)?)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }

    /// Checks, without changing anything, that the schema exists at this crate's
    /// version: for tools that only read.
    pub(crate) async fn check(&self, pool: &PgPool) -> Result<()> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{}.migrations", self.quoted))
            .fetch_one(pool)
            .await
            .map_err(db)?;
        if !exists {
            return schema::check(&self.name, None, MIGRATIONS.len());
        }
        let applied: i32 =
            sqlx::query_scalar(self.sql("SELECT COALESCE(max(version), 0) FROM {s}.migrations"))
                .fetch_one(pool)
                .await
                .map_err(db)?;
        schema::check(&self.name, Some(version(applied)), MIGRATIONS.len())
    }

    /// Says what to do when a migration's table lock was not granted in time.
    fn lock_not_granted(&self, e: sqlx::Error, timeout: Duration) -> Error {
        if let sqlx::Error::Database(d) = &e
            && d.code().as_deref() == Some("55P03")
        {
            return Error::backend(format!(
                "migrate: a table of schema {} stayed locked for {timeout:?} (a long query or \
                 open transaction uses it); nothing was changed: run migrate() again later, or \
                 raise Config::migrate_lock_timeout",
                self.name
            ));
        }
        db(e)
    }
}

/// A version as the migrations table stores it.
fn version(stored: i32) -> usize {
    usize::try_from(stored).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_schema_names_are_refused() {
        // A quote in the name would break the SQL: core's rules refuse it.
        assert!(Schema::new("relayq_2").is_ok());
        assert!(matches!(
            Schema::new("a\"b]c"),
            Err(Error::InvalidInput {
                field: "schema",
                ..
            })
        ));
    }

    #[test]
    fn limits_are_written_into_the_statement() {
        let s = Schema::new("app").unwrap();
        let AssertSqlSafe(sql) = s.sql_limit("SELECT 1 FROM {s}.jobs LIMIT {limit}", 17);
        assert_eq!(&*sql, "SELECT 1 FROM \"app\".jobs LIMIT 17");
    }

    #[test]
    fn statements_get_the_quoted_schema() {
        let s = Schema::new("app").unwrap();
        let AssertSqlSafe(sql) = s.sql("SELECT 1 FROM {s}.jobs JOIN {s}.queues");
        assert_eq!(&*sql, "SELECT 1 FROM \"app\".jobs JOIN \"app\".queues");
    }
}
