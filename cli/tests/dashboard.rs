//! `relayq dashboard`: refuses to listen beyond loopback without a token, and serves
//! the dashboard's API on the `--db` database.

mod common;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::Child,
};

use common::Env;

/// Kills the dashboard when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.0 GET; the status line and the body.
fn get(addr: &str, path: &str, extra: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the dashboard");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[test]
fn a_non_loopback_address_needs_a_token() {
    let env = Env::new();
    let out = env
        .run(&["dashboard", "--listen", "0.0.0.0:0"])
        .expect_code(2);
    assert!(out.stderr.contains("--token"), "{}", out.stderr);
    assert!(out.stderr.contains("0.0.0.0:0"), "{}", out.stderr);
    let out = env
        .run(&["dashboard", "--listen", "nowhere"])
        .expect_code(2);
    assert!(out.stderr.contains("--listen"), "{}", out.stderr);
    let out = env
        .run(&["dashboard", "-q", "bad name", "--listen", "127.0.0.1:0"])
        .expect_code(2);
    assert!(out.stderr.contains("queue"), "{}", out.stderr);
}

#[test]
fn serves_the_api_on_the_db_and_requires_its_token() {
    let env = Env::new();
    env.run(&[
        "enqueue",
        "--queue",
        "dq",
        "--",
        "echo",
        "<script>x</script>",
    ])
    .expect_code(0);
    let mut child = env
        .cmd(&[
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "-q",
            "dq",
            "--read-only",
        ])
        .env("RELAYQ_DASHBOARD_TOKEN", "tok-123")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn relayq dashboard");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    // The first line names the bound address (port 0 picks a free one).
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.contains("(read-only)"), "{line}");
    assert!(
        !line.contains("tok-123"),
        "the token is never printed: {line}"
    );
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();

    let (status, _) = get(&addr, "/api/queues", "");
    assert!(status.contains("401"), "{status}");
    let (status, body) = get(&addr, "/api/queues", "Authorization: Bearer tok-123\r\n");
    assert!(status.contains("200"), "{status}");
    let queues: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(queues[0]["queue"], "dq");
    assert_eq!(queues[0]["counts"]["ready"], 1);
    let (status, body) = get(&addr, "/metrics", "Authorization: Bearer tok-123\r\n");
    assert!(status.contains("200"), "{status}");
    assert!(
        body.contains(r#"relayq_queue_jobs{queue="dq",state="ready"} 1"#),
        "{body}"
    );
    drop(server);
}
