//! What the functions tests need of a server: its version, and a user it refuses
//! functions.

/// The server's major version (`INFO server`).
pub async fn major_version(url: &str) -> u32 {
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .expect("redis_version in INFO server")
}

/// The URL of `url`'s server as `user`, (re)made here: it may run anything on the keys
/// and channels of `prefix` but functions (`FCALL`, `FUNCTION`) and the admin and
/// dangerous commands, so a user left behind on the server can do no harm outside
/// its prefix. Needs Redis 7 (ACL rules for `FCALL`).
pub async fn user_without_functions(url: &str, user: &str, prefix: &str) -> String {
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = format!("~{prefix}:*");
    let channels = format!("&{prefix}:*");
    redis::cmd("ACL")
        .arg(&["SETUSER", user, "reset", "on", "nopass", &keys, &channels][..])
        .arg(
            &[
                "+@all",
                "-@admin",
                "-@dangerous",
                "-fcall",
                "-fcall_ro",
                "-function",
            ][..],
        )
        .exec_async(&mut c)
        .await
        .unwrap();
    // Any password opens a `nopass` user; without one, the client would not log in.
    url.replacen("redis://", &format!("redis://{user}:unused@"), 1)
}

/// One skip line, straight to stderr, past the test harness's output capture.
pub fn skip(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {line}");
}
