//! With the `otel` feature and `OTEL_EXPORTER_OTLP_ENDPOINT` set, a run's spans reach
//! that endpoint over OTLP/HTTP: a listener here plays the collector's receiving end
//! (an HTTP server taking `POST /v1/traces`), and the protobuf bodies it got must name
//! the spans and the queue.

mod common;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Mutex},
};

use common::{Env, example};

/// Every request body received, in order, with its path.
type Got = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

fn collector() -> (String, Got) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got: Got = Arc::default();
    let sink = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || serve(stream, &sink));
        }
    });
    (url, got)
}

/// Answers each request of one connection with an empty 200, keeping its body.
fn serve(stream: TcpStream, got: &Got) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        let mut length = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        got.lock().unwrap().push((path, body));
        let reply =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn a_runs_spans_reach_the_otlp_endpoint() {
    let (url, got) = collector();
    let env = Env::new();
    let queue = format!("otel-{:08x}", fastrand::u32(..));
    let plan = example("plan.toml");
    let out = env
        .cmd(&["run", plan.to_str().unwrap(), "--queue", &queue])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_SERVICE_NAME", "relayq-otel-test")
        .output()
        .expect("run relayq");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The run ended with the guard's flush: everything was sent before the exit.
    let got = got.lock().unwrap().clone();
    assert!(!got.is_empty(), "no OTLP request arrived");
    assert!(got.iter().all(|(path, _)| path == "/v1/traces"), "{got:?}");
    let bodies: Vec<u8> = got.into_iter().flat_map(|(_, b)| b).collect();
    for name in [
        "relayq.enqueue",
        "relayq.claim",
        "relayq.settle",
        "relayq.job",
        "relayq-otel-test",
        queue.as_str(),
    ] {
        assert!(contains(&bodies, name), "no {name:?} in what was exported");
    }
}
