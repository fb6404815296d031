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

/// The refusal in `e`, if it is one.
pub(crate) fn refusal(e: &RedisError) -> Option<Refusal> {
    let detail = e.detail().unwrap_or_default();
    match e.code() {
        Some("NOPERM") => Some(Refusal::Unsupported),
        Some("ERR") if detail.starts_with("Function not found") => Some(Refusal::NotLoaded),
        // Redis 6 answers "unknown command `FCALL`", Redis 7 "unknown command 'FCALL'".
        Some("ERR") if detail.to_ascii_lowercase().starts_with("unknown command") => {
            Some(Refusal::Unsupported)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;
    use relayq_conformance::harness::{Server, server_url};

    use super::*;

    /// Read off a real server's replies: a command it does not know (as `FCALL` is
    /// to Redis 6), a function it does not have, and, not a refusal, an error raised
    /// inside a running function.
    #[tokio::test]
    async fn refusals_are_told_from_other_errors() {
        let Some(url) = server_url(Server::Redis).await else {
            return;
        };
        let c = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let fails = |cmd: redis::Cmd| {
            let mut c = c.clone();
            async move { cmd.query_async::<Value>(&mut c).await.unwrap_err() }
        };
        let unknown = fails(redis::cmd("RELAYQ_NO_SUCH_COMMAND")).await;
        assert_eq!(refusal(&unknown), Some(Refusal::Unsupported), "{unknown}");
        let mut fcall = redis::cmd("FCALL");
        fcall.arg("relayq_no_such_function").arg(0);
        let missing = fails(fcall).await;
        assert_eq!(refusal(&missing), Some(Refusal::NotLoaded), "{missing}");
        let mut eval = redis::cmd("EVAL");
        eval.arg("return redis.call('RELAYQ_NO_SUCH_COMMAND')")
            .arg(0);
        let inside = fails(eval).await;
        assert_eq!(refusal(&inside), None, "{inside}");
    }
}
