//! `relayq work` started before its server waits for it: a
//! PostgreSQL and a Redis of our own, on free loopback ports in temp folders, started
//! only after the worker; a job enqueued then is done. The servers are stopped when the
//! test ends, however it ends.

mod common;

use std::{
    io::Read,
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{Env, eventually};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Each test starts its own server, so it needs the server's programs, not a URL:
/// without them it is reported as ignored, or failed when `RELAYQ_REQUIRE` names the
/// server.
fn main() {
    let trials = vec![
        trial(
            "relayq_work_started_before_postgres_serves_jobs_once_it_is_up",
            "postgres",
            pg_bin().map(|_| ()),
            || {
                let port = free_port();
                let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                says_so_once(&worker_waits(&url, port, start_postgres));
            },
        ),
        trial(
            "relayq_work_started_before_redis_serves_jobs_once_it_is_up",
            "redis",
            redis_installed(),
            || {
                let port = free_port();
                let url = format!("redis://127.0.0.1:{port}/0");
                says_so_once(&worker_waits(&url, port, start_redis));
            },
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}

fn trial(name: &str, server: &'static str, ready: Result<(), String>, test: fn()) -> Trial {
    let required = relayq_core::driver::required(server);
    Trial::ignorable_test(name, move || match ready {
        Ok(()) => {
            test();
            Ok(Completion::Completed)
        }
        Err(why) if required => Err(Failed::from(format!(
            "RELAYQ_REQUIRE names {server}, but {why}"
        ))),
        Err(why) => Ok(Completion::ignored_with(why)),
    })
    .with_kind(server)
}

/// The folder of PostgreSQL's server programs (`initdb`, `pg_ctl`), newest version
/// first.
fn pg_bin() -> Result<PathBuf, String> {
    // By version number ("9.6" sorts after "15" as text).
    let version = |bin: &PathBuf| -> Vec<u32> {
        let dir = bin.parent().and_then(|d| d.file_name()).unwrap_or_default();
        dir.to_string_lossy()
            .split('.')
            .map(|n| n.parse().unwrap_or(0))
            .collect()
    };
    std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .max_by_key(version)
        .ok_or_else(|| "no PostgreSQL server programs in /usr/lib/postgresql/*/bin".into())
}

fn redis_installed() -> Result<(), String> {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map(|_| ())
        .map_err(|e| format!("redis-server cannot be run: {e}"))
}

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

/// initdb + pg_ctl start as the postgres user.
fn start_postgres(port: u16) -> Server {
    let bin = pg_bin().expect("checked before the test ran");
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
            .arg(bin.join(tool))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let stop_data = data.clone();
    let pg_ctl = bin.join("pg_ctl");
    let server = Server {
        stop: Box::new(move || {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&pg_ctl)
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
    server
}

fn start_redis(port: u16) -> Server {
    let dir = server_dir("redis", port);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = child.expect("redis-server starts");
    Server {
        stop: Box::new(move || {
            let _ = child.kill();
            let _ = child.wait();
        }),
        dir,
    }
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
fn worker_waits(url: &str, port: u16, start: fn(u16) -> Server) -> String {
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
    let _server = start(port);
    wait_for_port(port, "the server");
    env.run(&["enqueue", "--queue", &q, "--", "touch done"])
        .expect_code(0);
    eventually(
        "the job done by the waiting worker",
        Duration::from_secs(30),
        || env.path("done").exists().then_some(()),
    );
    stderr.lock().unwrap().clone()
}

fn says_so_once(stderr: &str) {
    assert_eq!(
        stderr.matches("waiting for the server").count(),
        1,
        "one line per outage:\n{stderr}"
    );
}
