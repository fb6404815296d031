//! Schemas of the crate's own unit tests against a server: each test takes a fresh
//! name, so tests run in parallel and survive a dirty server, and drops it at the end.
//! (The integration tests in `tests/` have their own helpers.)

use sqlx::PgPool;

/// A schema name no other test uses: `relayq_t_<what>_` and 8 random hex digits.
pub(crate) fn fresh(what: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("relayq_t_{what}_{}", &id[..8])
}

/// Drops `schema` with everything in it.
pub(crate) async fn drop(pool: &PgPool, schema: &str) {
    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap();
}
