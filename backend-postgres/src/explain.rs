//! The plans PostgreSQL picks for the hot statements, for checking them on real data
//! (`explain_claim`, `explain_settle`, `explain_release`).

use relayq_core::Result;

use crate::{PostgresBackend, db};

impl PostgresBackend {
    /// `EXPLAIN EXECUTE` of `sql`, prepared with parameter types `types` and run with
    /// the SQL literals `args`: the custom plan, or with `generic` the generic plan a
    /// prepared statement may switch to after five executions.
    pub(crate) async fn explain(
        &self,
        sql: &str,
        types: &str,
        args: &str,
        generic: bool,
    ) -> Result<String> {
        // A connection of its own, closed after: PREPARE outlives transactions.
        let mut conn = self.pool().acquire().await.map_err(db)?.detach();
        let mode = if generic {
            "force_generic_plan"
        } else {
            "force_custom_plan"
        };
        let setup = format!(
            "SET plan_cache_mode = {mode};
             PREPARE relayq_explain ({types}) AS {sql}"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
            .execute(&mut conn)
            .await
            .map_err(db)?;
        let explain = format!("EXPLAIN EXECUTE relayq_explain ({args})");
        let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut conn)
            .await
            .map_err(db)?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(lines.join("\n"))
    }
}
