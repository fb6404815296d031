//! The whole conformance suite against standalone Redis as a user that may not run
//! functions: every operation then runs as a script (`EVALSHA`), the path taken on
//! Redis 6 and where an ACL denies `FCALL` or `FUNCTION`.

use std::sync::Arc;

use relayq_conformance::{Env, harness::Server};
use relayq_core::Backend;
use relayq_redis::RedisBackend;

const PREFIX: &str = "relayq-conformance-scripts";
const USER: &str = "relayq-conformance-no-functions";

async fn env() -> Option<Env> {
    let url = relayq_conformance::harness::server_url(Server::Redis).await?;
    let mut admin = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to Redis");
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", USER, "reset", "on", "nopass", "~*", "&*", "+@all",
            ][..],
        )
        .arg(&["-fcall", "-fcall_ro", "-function"][..])
        .exec(&mut admin)
        .expect("make a user without functions");
    let url = url.replacen("redis://", &format!("redis://{USER}:unused@"), 1);
    let backend = RedisBackend::connect_with_prefix(&url, PREFIX)
        .await
        .expect("connect to Redis");
    Some(Env::new(backend, move || {
        let url = url.clone();
        async move {
            let handle: Arc<dyn Backend> =
                Arc::new(RedisBackend::connect_with_prefix(&url, PREFIX).await?);
            Ok(handle)
        }
    }))
}

relayq_conformance::suite!(env);
