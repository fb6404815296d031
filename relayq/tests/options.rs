//! relayq's URL options reach the backend: two handles on one server with different
//! `?schema=` (PostgreSQL) or `?prefix=` (Redis) see different queues. Against the
//! servers of `RELAYQ_POSTGRES_URL` / `RELAYQ_REDIS_URL`, else reported as ignored.

use relayq::prelude::*;
use relayq_conformance::{
    harness::Server,
    queue_name,
    runner::{run, server_test},
};

fn main() {
    run(vec![
        server_test(
            Server::of(&relayq::postgres::DRIVER),
            "schema_and_max_connections_reach_postgres",
            schema_and_max_connections_reach_postgres,
        ),
        server_test(
            Server::of(&relayq::redis::DRIVER),
            "prefix_reaches_redis",
            prefix_reaches_redis,
        ),
    ])
}

/// A job enqueued through `a` is in `a`'s queue and not in `b`'s.
async fn apart(a: &dyn Backend, b: &dyn Backend) {
    let q = queue_name("opts");
    a.enqueue_one(NewJob::new(&q, b"x".to_vec())).await.unwrap();
    assert_eq!(a.queue_stats(&q).await.unwrap().count(JobState::Ready), 1);
    assert_eq!(b.queue_stats(&q).await.unwrap().count(JobState::Ready), 0);
}

fn with(url: &str, option: &str) -> String {
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}{option}")
}

async fn schema_and_max_connections_reach_postgres(url: String) {
    let tag = uuid_tag();
    let (sa, sb) = (format!("relayq_opt_a_{tag}"), format!("relayq_opt_b_{tag}"));
    let a = relayq::connect(&with(&url, &format!("schema={sa}&max_connections=2")))
        .await
        .unwrap();
    let b = relayq::connect(&with(&url, &format!("schema={sb}")))
        .await
        .unwrap();
    apart(&*a, &*b).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let jobs: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{sa}\".jobs"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(jobs, 1, "the job is in schema {sa}");
    for s in [sa, sb] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{s}\" CASCADE")))
            .execute(&pool)
            .await
            .unwrap();
    }
    let e = relayq::connect(&with(&url, "max_connections=0"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.invalid_field(), Some("max_connections"), "{e}");
}

async fn prefix_reaches_redis(url: String) {
    let tag = uuid_tag();
    let (pa, pb) = (format!("relayq-opt-a-{tag}"), format!("relayq-opt-b-{tag}"));
    let a = relayq::connect(&with(&url, &format!("prefix={pa}")))
        .await
        .unwrap();
    let b = relayq::connect(&with(&url, &format!("prefix={pb}")))
        .await
        .unwrap();
    apart(&*a, &*b).await;
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for p in [pa, pb] {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{p}*"))
            .query_async(&mut c)
            .await
            .unwrap();
        if p.starts_with("relayq-opt-a") {
            assert!(!keys.is_empty(), "keys under {p}");
        }
        for k in keys {
            let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
        }
    }
}

fn uuid_tag() -> String {
    format!("{:08x}", fastrand::u32(..))
}
