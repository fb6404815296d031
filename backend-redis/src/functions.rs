//! What a server's refusal of `FCALL` or `FUNCTION LOAD` means (see `scripts`).

use redis::RedisError;

/// Why a server refused to run one of relayq's functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It has no such function: the library was never loaded there, or was lost.
    /// Nothing ran.
    NotLoaded,
    /// It runs no functions for us: a server before Redis 7.0 (no such command), or
    /// an ACL that denies `FCALL` or `FUNCTION`.
    Unsupported,
}

/// The refusal in `e`, if it is one. Only replies that name `FCALL` or `FUNCTION` count,
/// as the server gives them before running anything: an error raised inside a running
/// function may read alike ("Unknown command called from script") after it wrote, and
/// must not be taken for a refusal and run again as a script.
pub(crate) fn refusal(e: &RedisError) -> Option<Refusal> {
    let detail = e.detail().unwrap_or_default().to_ascii_lowercase();
    // Redis 7 quotes a command as 'fcall', Redis 6 as `fcall`; FUNCTION LOAD is denied
    // as 'function|load'.
    let ours = ["'fcall", "`fcall", "'function", "`function"];
    let unknown = ours
        .iter()
        .any(|cmd| detail.starts_with(&format!("unknown command {cmd}")));
    // "this user has no permissions to run the 'fcall' command" (Redis 7.0), "User
    // <name> has no permissions to run the 'fcall' command" (7.2). A key's or a
    // channel's refusal is the operation's error, not this.
    let denied = ours
        .iter()
        .any(|cmd| detail.contains(&format!("permissions to run the {cmd}")));
    match e.code() {
        Some("ERR") if detail.starts_with("function not found") => Some(Refusal::NotLoaded),
        Some("ERR") if unknown => Some(Refusal::Unsupported),
        Some("NOPERM") if denied => Some(Refusal::Unsupported),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;
    use relayq_conformance::harness::{Server, server_url};

    use super::*;

    /// An error reply as it comes off the wire.
    fn reply(wire: &str) -> RedisError {
        redis::parse_redis_value(format!("-{wire}\r\n").as_bytes())
            .and_then(Value::extract_error)
            .unwrap_err()
    }

    /// Replies of servers not on this machine, as they send them: Redis 6 knows no
    /// `FCALL` or `FUNCTION`; Valkey words an unknown command inside a running function
    /// alike, which is no refusal (the function may have written).
    #[test]
    fn refusals_by_other_servers_wording() {
        let redis6 = reply("ERR unknown command `FCALL`, with args beginning with: `x`, `1`, ");
        assert_eq!(refusal(&redis6), Some(Refusal::Unsupported), "{redis6}");
        let load = reply("ERR unknown command `FUNCTION`, with args beginning with: `LOAD`, ");
        assert_eq!(refusal(&load), Some(Refusal::Unsupported), "{load}");
        let valkey =
            reply("ERR Unknown command called from script script: x, on @user_function: 1.");
        assert_eq!(refusal(&valkey), None, "{valkey}");
    }

    /// Read off a real server's replies: a function it does not have; an ACL that
    /// denies `FCALL` (a refusal) or a key (not one); and, not a refusal, an unknown
    /// command inside a running script.
    #[tokio::test]
    #[cfg_attr(relayq_no_redis, ignore = "no redis server: RELAYQ_REDIS_URL unset")]
    async fn refusals_are_told_from_other_errors() {
        let url = server_url(Server::of(&crate::DRIVER))
            .await
            .expect("RELAYQ_REDIS_URL");
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .unwrap();
        let major = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
        let fails = |mut c: redis::aio::MultiplexedConnection, cmd: redis::Cmd| async move {
            cmd.query_async::<Value>(&mut c).await.unwrap_err()
        };
        let mut fcall = redis::cmd("FCALL");
        fcall.arg("relayq_no_such_function").arg(0);
        let missing = fails(c.clone(), fcall.clone()).await;
        if major < Some(7) {
            // No functions at all: FCALL itself is refused, and scripts are used.
            assert_eq!(refusal(&missing), Some(Refusal::Unsupported), "{missing}");
            return;
        }
        assert_eq!(refusal(&missing), Some(Refusal::NotLoaded), "{missing}");
        let mut eval = redis::cmd("EVAL");
        eval.arg("return redis.call('RELAYQ_NO_SUCH_COMMAND')")
            .arg(0);
        let inside = fails(c.clone(), eval).await;
        assert_eq!(refusal(&inside), None, "{inside}");

        // A user that may run neither FCALL nor anything on keys outside `relayq-acl:`.
        let user = "relayq-test-refusals";
        let rules = ["reset", "on", "nopass", "~relayq-acl:*", "+@all", "-@admin"];
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg(user).arg(&rules[..]);
        setuser.arg(&["-@dangerous", "-fcall"][..]);
        let () = setuser.query_async(&mut c.clone()).await.unwrap();
        let as_user = url.replacen("redis://", &format!("redis://{user}:unused@"), 1);
        let denied = redis::Client::open(as_user)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let refused = fails(denied.clone(), fcall).await;
        assert_eq!(refusal(&refused), Some(Refusal::Unsupported), "{refused}");
        let mut get = redis::cmd("GET");
        get.arg("not-relayq-acl");
        let key = fails(denied, get).await;
        assert_eq!(refusal(&key), None, "{key}");
    }
}
