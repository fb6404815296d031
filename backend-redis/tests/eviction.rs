//! Servers configured to lose jobs are refused: a redis-server of
//! our own, on a free loopback port in a temp folder, with `maxmemory-policy
//! allkeys-lru`; stopped when the test ends, however it ends.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use relayq_redis::RedisBackend;

/// A redis-server of our own; killed on drop.
struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

relayq_conformance::server_tests! {
    server: relayq_conformance::harness::Server::of(&relayq_redis::DRIVER),
    tests: [],
    local: [
        a_server_that_may_evict_keys_is_refused_unless_the_url_allows_it,
        a_server_without_config_is_not_refused,
    ],
}

/// Starts redis-server with `args`; the test is ignored when it is not installed (or
/// fails, when `RELAYQ_REQUIRE` names redis). The two tests here run at once, and a
/// free port may be taken between the look and the server's bind: a server that exits
/// instead of answering is started again on another port, so a test never talks to
/// the other test's server.
fn start(args: &[&str]) -> Server {
    for _ in 0..5 {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("relayq-eviction-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            let _ = std::fs::remove_dir_all(&dir);
            relayq_conformance::runner::missing(
                relayq_conformance::harness::Server::of(&relayq_redis::DRIVER),
                "redis-server is not installed",
            );
        };
        let mut server = Server { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Exited: its port was taken; another one.
            if server.child.try_wait().ok().flatten().is_some() {
                break;
            }
            // Listening, and ours: the server on the port is our process.
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                if served_by(port, server.child.id()) {
                    return server;
                }
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("redis-server exited at start on five free ports");
}

/// Whether the redis-server on `port` is process `pid` (`INFO server`; `CONFIG` may be
/// disabled).
fn served_by(port: u16, pid: u32) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/0")) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection() else {
        return false;
    };
    let info: redis::RedisResult<String> = redis::cmd("INFO").arg("server").query(&mut conn);
    info.is_ok_and(|i| i.lines().any(|l| l.trim() == format!("process_id:{pid}")))
}

async fn a_server_that_may_evict_keys_is_refused_unless_the_url_allows_it() {
    let server = start(&["--maxmemory-policy", "allkeys-lru"]);
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    let e = RedisBackend::connect(&url).await.unwrap_err();
    assert_eq!(e.invalid_field(), Some("maxmemory-policy"), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("allkeys-lru") && text.contains("allow_eviction=true"),
        "{text}"
    );

    assert!(
        RedisBackend::connect(&format!("{url}?allow_eviction=true"))
            .await
            .is_ok()
    );
    let e = RedisBackend::connect(&format!("{url}?allow_eviction=perhaps"))
        .await
        .unwrap_err();
    assert_eq!(e.invalid_field(), Some("allow_eviction"), "{e}");

    // Set right, the same server is taken.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(RedisBackend::connect(&url).await.is_ok());
}

/// Where CONFIG is disabled (as on managed services) the policy cannot be read, and
/// the connection is not refused for it.
async fn a_server_without_config_is_not_refused() {
    let server = start(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    assert!(RedisBackend::connect(&url).await.is_ok());
}
