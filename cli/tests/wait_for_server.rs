//! `relayq work` started before its server waits for it (issue 42, item 3): a
//! PostgreSQL and a Redis of our own, on free loopback ports in temp folders, started
//! only after the worker; a job enqueued then is done. The servers are stopped when the
//! test ends, however it ends.

mod common;

use std::{
    io::Read,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{Env, eventually};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server process of our own: stopped, and its folder removed, on drop.
struct Server {
    stop: Box<dyn FnMut()>,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        (self.stop)();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server_dir(kind: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("relayq-{kind}-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("server dir");
    dir
}

/// initdb + pg_ctl start as the postgres user; `None` (one skip line) without them.
fn start_postgres(port: u16) -> Option<Server> {
    if !Path::new(PG_BIN).join("initdb").exists() {
        eprintln!("SKIPPED: no PostgreSQL 15 binaries at {PG_BIN}");
        return None;
    }
    let dir = server_dir("pg", port);
    let data = dir.join("data");
    let ok = Command::new("chown")
        .arg("postgres")
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown the server folder to postgres");
    let as_postgres = |tool: &str| {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join(tool))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let stop_data = data.clone();
    let server = Server {
        stop: Box::new(move || {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(Path::new(PG_BIN).join("pg_ctl"))
                .arg("-D")
                .arg(&stop_data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }),
        dir,
    };
    let ok = as_postgres("initdb")
        .args(["-A", "trust", "-U", "postgres", "-D"])
        .arg(&data)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "initdb");
    let ok = as_postgres("pg_ctl")
        .arg("-D")
        .arg(&data)
        .arg("-o")
        .arg(format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            server.dir.display()
        ))
        .args(["-w", "start"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "pg_ctl start");
    Some(server)
}

fn start_redis(port: u16) -> Option<Server> {
    let dir = server_dir("redis", port);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("SKIPPED: redis-server is not installed");
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    };
    Some(Server {
        stop: Box::new(move || {
            let _ = child.kill();
            let _ = child.wait();
        }),
        dir,
    })
}

/// The worker, killed however the test ends.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `relayq work` against `url` while nothing listens at `port`, waits for it to
/// say it waits, starts the server, then enqueues a command and waits for it to have
/// run; returns the worker's stderr.
fn worker_waits(url: &str, port: u16, start: fn(u16) -> Option<Server>) -> Option<String> {
    let env = Env::with_db(url);
    let q = format!("wait-{port}");
    let mut worker = Worker(env.spawn(&["work", "--queue", &q]));
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = worker.0.stderr.take().expect("piped stderr");
    let sink = stderr.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    // PostgreSQL's pool says it cannot connect only after its acquire timeout (30 s).
    eventually(
        "the worker to say it waits",
        Duration::from_secs(60),
        || {
            stderr
                .lock()
                .unwrap()
                .contains("waiting for the server")
                .then_some(())
        },
    );
    assert!(
        worker.0.try_wait().expect("worker state").is_none(),
        "relayq work exited while its server was down"
    );
    let _server = start(port)?;
    wait_for_port(port, "the server");
    env.run(&["enqueue", "--queue", &q, "--", "touch done"])
        .expect_code(0);
    eventually(
        "the job done by the waiting worker",
        Duration::from_secs(30),
        || env.path("done").exists().then_some(()),
    );
    let text = stderr.lock().unwrap().clone();
    Some(text)
}

fn says_so_once(stderr: &str) {
    assert_eq!(
        stderr.matches("waiting for the server").count(),
        1,
        "one line per outage:\n{stderr}"
    );
}

#[test]
fn relayq_work_started_before_postgres_serves_jobs_once_it_is_up() {
    let port = free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    if let Some(stderr) = worker_waits(&url, port, start_postgres) {
        says_so_once(&stderr);
    }
}

#[test]
fn relayq_work_started_before_redis_serves_jobs_once_it_is_up() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    if let Some(stderr) = worker_waits(&url, port, start_redis) {
        says_so_once(&stderr);
    }
}
