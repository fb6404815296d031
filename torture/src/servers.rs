//! The run's own servers, on free loopback ports in its temporary folder: never the
//! machine's shared ones. Each is stopped when dropped, even after a failure.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Polls `ready` every 100 ms until it says yes or `limit` passes.
///
/// # Errors
/// When `limit` passes first.
pub fn wait_until(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what}: not ready after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A free loopback port; with `bus`, port + 10000 is free too (a cluster node's bus).
///
/// # Errors
/// When no port is found in a hundred tries.
pub fn free_port(bus: bool) -> anyhow::Result<u16> {
    let mut rng = fastrand::Rng::new();
    for _ in 0..100 {
        let port = if bus {
            rng.u16(20_000..30_000)
        } else {
            rng.u16(20_000..50_000)
        };
        let ok = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if ok(port) && (!bus || ok(port + 10_000)) {
            return Ok(port);
        }
    }
    bail!("no free loopback port")
}

/// Runs a command to its end; its output goes into the error when it fails.
///
/// # Errors
/// When it cannot start or exits non-zero.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A PostgreSQL made with `initdb` in the run's folder: fsync on, autovacuum on (the
/// defaults, set explicitly), run as user `postgres` when this runs as root.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    up: bool,
}

impl Postgres {
    fn cmd(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    /// `initdb` and start on a free port; creates the database `torture`.
    ///
    /// # Errors
    /// When no PostgreSQL is installed under `/usr/lib/postgresql`, or it does not start.
    pub fn start(root: &Path) -> anyhow::Result<Self> {
        let mut bins: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .context("no /usr/lib/postgresql: PostgreSQL is not installed")?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .collect();
        bins.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
        });
        let bin = bins
            .pop()
            .context("no initdb under /usr/lib/postgresql/*/bin")?;
        let dir = root.join("pg");
        std::fs::create_dir_all(&dir)?;
        if is_root() {
            run(Command::new("chmod").arg("755").arg(root))?;
            run(Command::new("chown").args(["-R", "postgres"]).arg(&dir))?;
        }
        let mut pg = Self {
            bin,
            dir,
            port: free_port(false)?,
            up: false,
        };
        run(pg.cmd("initdb").arg("-D").arg(pg.dir.join("data")).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-instructions",
        ]))?;
        pg.start_server()?;
        run(pg.psql("postgres").arg("-c").arg("CREATE DATABASE torture"))?;
        Ok(pg)
    }

    fn start_server(&mut self) -> anyhow::Result<()> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c autovacuum=on -c max_connections=200",
            self.port,
            self.dir.display()
        );
        run(self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"]))?;
        self.up = true;
        Ok(())
    }

    fn stop_server(&mut self, mode: &str) -> anyhow::Result<()> {
        run(self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-t", "60", "-m", mode, "stop"]))?;
        self.up = false;
        Ok(())
    }

    fn psql(&self, db: &str) -> Command {
        let mut c = Command::new("psql");
        c.args(["-h", "127.0.0.1", "-U", "postgres", "-X", "-q", "-t", "-A"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(db);
        c
    }

    /// The database's URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/torture", self.port)
    }

    /// `pg_ctl stop -m fast` (clean) or `-m immediate` (a crash: recovery from the WAL
    /// at the next start), then start again.
    ///
    /// # Errors
    /// When it does not stop or start.
    pub fn restart(&mut self, crash: bool) -> anyhow::Result<()> {
        self.stop_server(if crash { "immediate" } else { "fast" })?;
        self.start_server()
    }

    /// `pg_terminate_backend` of every other connection to the database; how many.
    ///
    /// # Errors
    /// When psql fails.
    pub fn kill_connections(&self) -> anyhow::Result<u32> {
        let out = run(self.psql("torture").arg("-c").arg(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = 'torture' AND pid <> pg_backend_pid()",
        ))?;
        Ok(out.trim().parse().unwrap_or(0))
    }

    /// Runs `sql` with `psql` in the database `torture`; its unaligned output.
    ///
    /// # Errors
    /// When `psql` fails.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        run(self.psql("torture").arg("-c").arg(sql))
    }

    /// Stops the server (`-m fast`).
    ///
    /// # Errors
    /// When it does not stop.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.up {
            self.stop_server("fast")?;
        }
        Ok(())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.up {
            let _ = self.stop_server("immediate");
        }
    }
}

/// `appendfsync` of a Redis run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Every write on disk before its reply.
    Always,
    /// Once a second.
    Everysec,
}

impl Fsync {
    /// Its name in redis.conf.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::Everysec => "everysec",
        }
    }
}

/// One `redis-server` child with `appendonly yes`.
#[derive(Debug)]
pub struct RedisNode {
    dir: PathBuf,
    /// Its port.
    pub port: u16,
    fsync: Fsync,
    cluster: bool,
    child: Option<Child>,
}

impl RedisNode {
    /// Starts a node in `dir` on a free port.
    ///
    /// # Errors
    /// When `redis-server` cannot start or does not answer.
    pub fn start(dir: PathBuf, fsync: Fsync, cluster: bool) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut node = Self {
            dir,
            port: free_port(cluster)?,
            fsync,
            cluster,
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut c = Command::new("redis-server");
        c.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
            .args(["--appendfsync", self.fsync.word()])
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("log"));
        if self.cluster {
            c.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "3000"])
                .arg("--cluster-config-file")
                .arg(self.dir.join("nodes.conf"));
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server")?;
        self.child = Some(child);
        let port = self.port;
        wait_until(
            &format!("redis-server on {port}"),
            Duration::from_secs(60),
            || self.cli(&["ping"]).is_ok_and(|o| o.trim() == "PONG"),
        )
    }

    /// `redis-cli -p PORT ARGS...`.
    ///
    /// # Errors
    /// When it fails.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args))
    }

    /// A clean `SHUTDOWN` (the AOF is flushed and fsynced) or SIGKILL, then a start
    /// that loads the AOF.
    ///
    /// # Errors
    /// When it does not stop or start.
    pub fn restart(&mut self, crash: bool) -> anyhow::Result<()> {
        self.halt(crash)?;
        self.spawn()
    }

    /// Stops it: `SHUTDOWN` or SIGKILL; waits for the process to end.
    ///
    /// # Errors
    /// When it cannot be signalled.
    pub fn halt(&mut self, crash: bool) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if crash {
            kill(pid_of(&child), Signal::SIGKILL)?;
        } else if self.cli(&["shutdown"]).is_err() {
            // redis-cli reports the closed connection of a SHUTDOWN that worked as an
            // error on some versions; the wait below tells.
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                kill(pid_of(&child), Signal::SIGKILL)?;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `CLIENT KILL TYPE normal`: every client connection but this one; how many.
    ///
    /// # Errors
    /// When it fails.
    pub fn kill_connections(&self) -> anyhow::Result<u32> {
        Ok(self
            .cli(&["client", "kill", "type", "normal"])?
            .trim()
            .parse()
            .unwrap_or(0))
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"))
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Three masters, no replicas, created with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct Cluster {
    /// Its nodes.
    pub nodes: Vec<RedisNode>,
}

impl Cluster {
    /// Starts three nodes and makes them a cluster.
    ///
    /// # Errors
    /// When a node does not start or the cluster does not become ok.
    pub fn start(root: &Path) -> anyhow::Result<Self> {
        let nodes = (0..3)
            .map(|i| RedisNode::start(root.join(format!("node{i}")), Fsync::Always, true))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        run(Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"]))?;
        let cluster = Self { nodes };
        cluster.wait_ok()?;
        Ok(cluster)
    }

    /// Waits until every node says `cluster_state:ok`.
    ///
    /// # Errors
    /// After 60 s.
    pub fn wait_ok(&self) -> anyhow::Result<()> {
        wait_until("redis cluster", Duration::from_secs(60), || {
            self.nodes.iter().all(|n| {
                n.cli(&["cluster", "info"])
                    .is_ok_and(|o| o.contains("cluster_state:ok"))
            })
        })
    }

    /// The facade's URL.
    #[must_use]
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    /// The node holding the most keys (the queue's keys share one hash slot).
    #[must_use]
    pub fn busiest(&self) -> usize {
        (0..self.nodes.len())
            .max_by_key(|&i| {
                self.nodes[i]
                    .cli(&["dbsize"])
                    .ok()
                    .and_then(|o| o.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }
}
