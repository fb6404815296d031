//! Servers configured to lose jobs are refused.
//!
//! With a `maxmemory-policy` other than `noeviction`, a Redis server that reaches its
//! `maxmemory` deletes keys to make room: queue keys among them, so jobs vanish without
//! an error anywhere (BullMQ refuses such servers for the same reason). Under
//! `noeviction` it refuses writes instead, and the caller sees the error. So `connect`
//! asks the server for the policy and refuses anything else, unless the URL carries
//! `allow_eviction=true` (for those who know their data fits, or accept the loss).
//!
//! Managed services often disable or rename `CONFIG`: the check is then skipped, with
//! one log line, and the operator is responsible for the policy (see the README).

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use relayq_core::{Error, Result};

/// The URL option that turns the check off.
pub const OPT_OUT: &str = "allow_eviction";

/// `url` without the [`OPT_OUT`] option (the driver would not know it), and whether
/// it was set to true.
///
/// # Errors
/// [`Error::InvalidInput`] on `allow_eviction` for a value other than true/false/1/0.
pub fn split_url(url: &str) -> Result<(String, bool)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), false));
    };
    let (mut kept, mut allow) = (Vec::new(), false);
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((OPT_OUT, value)) => {
                allow = match value {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(Error::invalid(
                            OPT_OUT,
                            format!("must be true or false, got {other:?}"),
                        ));
                    }
                };
            }
            _ if pair == OPT_OUT => allow = true,
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, allow))
}

/// Refuses a server whose `maxmemory-policy` may evict keys. `node` names the server
/// in the error (a cluster has several).
///
/// # Errors
/// [`Error::InvalidInput`] on `maxmemory-policy` for a policy other than `noeviction`;
/// [`Error::Backend`] when the server cannot be reached.
pub async fn check(conn: &mut impl ConnectionLike, node: &str) -> Result<()> {
    let answer: redis::RedisResult<HashMap<String, String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    let policy = match answer {
        Ok(mut map) => map.remove("maxmemory-policy"),
        // The server answered with an error: CONFIG disabled, renamed, or denied by an
        // ACL, as on most managed services. Not knowing is not a reason to fail.
        Err(e) if e.kind() != redis::ErrorKind::Io && !e.is_connection_dropped() => {
            tracing::info!(node, error = %e, "cannot read maxmemory-policy (CONFIG refused); make sure it is noeviction, or jobs can be evicted");
            return Ok(());
        }
        Err(e) => return Err(crate::db(e)),
    };
    match policy.as_deref() {
        Some("noeviction") | None => Ok(()),
        Some(other) => Err(Error::invalid(
            "maxmemory-policy",
            format!(
                "the Redis server at {node} has maxmemory-policy {other}: when it reaches maxmemory it deletes keys, queued jobs among them, without an error; set `CONFIG SET maxmemory-policy noeviction` (and in redis.conf), or add {OPT_OUT}=true to the URL to accept that risk"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opt_out_is_taken_out_of_the_url() {
        assert_eq!(
            split_url("redis://h:6379/0").unwrap(),
            ("redis://h:6379/0".into(), false)
        );
        assert_eq!(
            split_url("redis://h:6379/0?allow_eviction=true").unwrap(),
            ("redis://h:6379/0".into(), true)
        );
        assert_eq!(
            split_url("redis://h/0?protocol=resp3&allow_eviction=1").unwrap(),
            ("redis://h/0?protocol=resp3".into(), true)
        );
        assert_eq!(
            split_url("redis://h/0?allow_eviction=false&protocol=resp3").unwrap(),
            ("redis://h/0?protocol=resp3".into(), false)
        );
        let e = split_url("redis://h/0?allow_eviction=maybe").unwrap_err();
        assert_eq!(e.invalid_field(), Some(OPT_OUT));
    }
}
