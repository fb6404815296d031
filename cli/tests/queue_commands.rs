//! `enqueue`, `work`, `wait`, `cancel` and `batch` against one database file, with
//! `relayq work` running as a separate process.

mod common;

use std::{
    process::Child,
    time::{Duration, Instant},
};

use common::{Env, eventually};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Sends SIGTERM and waits (polling, with a deadline) for the process to exit.
fn terminate(mut child: Child, limit: Duration) -> (i32, String) {
    let pid = i32::try_from(child.id()).expect("pid fits i32");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    let status = eventually("the worker to exit", limit, || {
        child.try_wait().expect("try_wait")
    });
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut stdout).ok();
    }
    (status.code().unwrap_or(-1), stdout)
}

/// Kills the child if a test fails before terminating it.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_worker_runs_an_enqueued_command_and_stops_on_sigterm() {
    let env = Env::new();
    let marker = env.path("touched");
    // Enqueue first (creating the database), then start the worker.
    let out = env
        .run(&[
            "enqueue",
            "--queue",
            "jobs",
            "--name",
            "toucher",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ])
        .expect_code(0);
    let id = out.stdout.trim().to_owned();
    assert!(
        id.parse::<i64>().is_ok(),
        "enqueue printed {:?}",
        out.stdout
    );
    let mut worker = Reap(Some(env.spawn(&[
        "work",
        "--queue",
        "jobs",
        "--concurrency",
        "2",
    ])));

    eventually(
        "the command to touch the file",
        Duration::from_secs(20),
        || marker.exists().then_some(()),
    );
    eventually("the job to be succeeded", Duration::from_secs(10), || {
        (env.count("jobs", "succeeded") == 1).then_some(())
    });
    let (code, stdout) = terminate(worker.0.take().unwrap(), Duration::from_secs(20));
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "start   job {id} of \"jobs\" (attempt 1/1) toucher: touch"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("ok      job {id} of \"jobs\"")),
        "{stdout}"
    );
    assert!(stdout.contains("SIGTERM: stopping"), "{stdout}");
    assert!(
        stdout.contains("stopped: 1 claimed, 1 succeeded"),
        "{stdout}"
    );

    // The execution log names the worker.
    let shown = env
        .run(&["job", &id, "--queue", "jobs", "--json"])
        .expect_code(0);
    let job: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(job["state"], "succeeded");
    let worker_name = job["attempts"][0]["worker"].as_str().unwrap();
    assert!(worker_name.starts_with("work@"), "{worker_name}");
}

#[test]
fn sigterm_past_the_shutdown_timeout_kills_the_command_and_releases_the_job() {
    let env = Env::new();
    let pidfile = env.path("pid");
    let command = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    env.run(&["enqueue", "--queue", "slow", "--", &command])
        .expect_code(0);
    let mut worker = Reap(Some(env.spawn(&[
        "work",
        "--queue",
        "slow",
        "--shutdown-timeout",
        "300ms",
    ])));

    let status = eventually("the job to run", Duration::from_secs(20), || {
        let s = env.status("slow");
        (s["running"].as_array().map(Vec::len) == Some(1)).then_some(s)
    });
    assert!(
        status["running"][0]["worker"]
            .as_str()
            .unwrap()
            .starts_with("work@")
    );
    let pid: i32 = eventually(
        "the command to write its pid",
        Duration::from_secs(10),
        || std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok(),
    );

    let begun = Instant::now();
    let (code, stdout) = terminate(worker.0.take().unwrap(), Duration::from_secs(20));
    assert_eq!(code, 0, "{stdout}");
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );
    assert!(stdout.contains("1 released"), "{stdout}");
    // Released, not failed: ready again for another worker, the attempt not counted.
    assert_eq!(env.count("slow", "ready"), 1);
    assert_eq!(env.count("slow", "running"), 0);
    // The command was killed with its worker: no `sleep 60` left behind.
    eventually("the command to be gone", Duration::from_secs(5), || {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        (!alive).then_some(())
    });
}

#[test]
fn wait_times_out_with_exit_code_124_and_a_clear_message() {
    let env = Env::new();
    let batch = env
        .run(&["batch", "open", "--queue", "w", "--on-failure", "halt"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    env.run(&[
        "enqueue", "--queue", "w", "--batch", &batch, "--stage", "1", "--", "true",
    ])
    .expect_code(0);
    env.run(&["batch", "seal", &batch, "--queue", "w"])
        .expect_code(0);

    let begun = Instant::now();
    let out = env
        .run(&[
            "wait",
            &batch,
            "--queue",
            "w",
            "--stage",
            "1",
            "--timeout",
            "300ms",
        ])
        .expect_code(124);
    assert!(begun.elapsed() >= Duration::from_millis(300));
    assert!(
        out.stderr.contains(&format!(
            "timed out after 300 ms waiting for stage 1 of batch {batch} of queue \"w\": 1 pending and 0 running jobs left"
        )),
        "{}",
        out.stderr
    );

    // An unknown batch is bad input, not a timeout.
    let out = env
        .run(&["wait", "999", "--queue", "w", "--timeout", "1s"])
        .expect_code(2);
    assert!(out.stderr.contains("not found"), "{}", out.stderr);

    // One job: a timeout says what it is; a cancelled one ends the wait with 1; an
    // unknown one is bad input.
    let job = env
        .run(&["enqueue", "--queue", "w", "--", "true"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    let out = env
        .run(&["wait", "--job", &job, "--queue", "w", "--timeout", "300ms"])
        .expect_code(124);
    assert!(
        out.stderr.contains(&format!(
            "waiting for job {job} of queue \"w\": it is ready"
        )),
        "{}",
        out.stderr
    );
    env.run(&["cancel", "--job", &job, "--queue", "w"])
        .expect_code(0);
    let out = env
        .run(&["wait", "--job", &job, "--queue", "w", "--timeout", "5s"])
        .expect_code(1);
    assert!(
        out.stderr.contains(&format!("job {job} ended cancelled")),
        "{}",
        out.stderr
    );
    env.run(&["wait", "--job", "999", "--queue", "w", "--timeout", "1s"])
        .expect_code(2);
}

#[test]
fn enqueue_into_a_sealed_batch_is_refused_and_stores_nothing() {
    let env = Env::new();
    let batch = env
        .run(&["batch", "open", "--queue", "s"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    env.run(&["batch", "seal", &batch, "--queue", "s"])
        .expect_code(0);
    let out = env
        .run(&["enqueue", "--queue", "s", "--batch", &batch, "--", "true"])
        .expect_code(2);
    assert!(out.stderr.contains("--batch:"), "{}", out.stderr);
    assert_eq!(env.status("s")["stats"]["total"], 0);
}

#[test]
fn cancel_a_job_and_a_batch() {
    let env = Env::new();
    let id = env
        .run(&["enqueue", "--queue", "c", "--", "true"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    let out = env
        .run(&["cancel", "--queue", "c", "--job", &id])
        .expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("job {id} of queue \"c\" is cancelled")),
        "{}",
        out.stdout
    );
    let out = env
        .run(&["cancel", "--queue", "c", "--job", &id])
        .expect_code(0);
    assert!(
        out.stdout.contains("had already finished"),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("c", "cancelled"), 1);

    let batch = env
        .run(&["batch", "open", "--queue", "c"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    for stage in ["1", "2"] {
        env.run(&[
            "enqueue", "--queue", "c", "--batch", &batch, "--stage", stage, "--", "true",
        ])
        .expect_code(0);
    }
    let out = env
        .run(&["cancel", "--queue", "c", "--batch", &batch])
        .expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("batch {batch} of queue \"c\": 2 job(s) cancelled")),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("c", "cancelled"), 3);

    // --job and --batch together are a usage error.
    env.run(&["cancel", "--queue", "c", "--job", &id, "--batch", &batch])
        .expect_code(2);
    // So is an unknown job.
    let out = env
        .run(&["cancel", "--queue", "c", "--job", "424242"])
        .expect_code(2);
    assert!(out.stderr.contains("not found"), "{}", out.stderr);
}

/// SPEC B9: `cancel --all -q` purges the queue: every unfinished job cancelled, the
/// finished ones and other queues left; without `-q` it is a usage error.
#[test]
fn cancel_all_purges_the_queue() {
    let env = Env::new();
    for q in ["p", "p", "p", "other"] {
        env.run(&["enqueue", "--queue", q, "--", "true"])
            .expect_code(0);
    }
    env.run(&["cancel", "--all"]).expect_code(2);
    let out = env.run(&["cancel", "--all", "-q", "p"]).expect_code(0);
    assert!(
        out.stdout
            .contains("queue \"p\": 3 unfinished job(s) cancelled"),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("p", "cancelled"), 3);
    assert_eq!(env.count("other", "ready"), 1);
}

/// Without `-q`, `cancel --job` finds the job in whichever queue holds it, as `job`
/// does, rather than looking only in queue `default`.
#[test]
fn cancel_finds_a_job_of_any_queue() {
    let env = Env::new();
    let id = env
        .run(&["enqueue", "--queue", "elsewhere", "--", "true"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    let out = env.run(&["cancel", "--job", &id]).expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("job {id} of queue \"elsewhere\" is cancelled")),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("elsewhere", "cancelled"), 1);
}

#[test]
fn run_now_makes_a_scheduled_job_due_and_says_when_it_cannot() {
    let env = Env::new();
    let id = env
        .run(&["enqueue", "--queue", "later", "--delay", "1h", "--", "true"])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    assert_eq!(env.count("later", "scheduled"), 1);
    let out = env.run(&["run-now", "--job", &id]).expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("job {id} of queue \"later\" is due now")),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("later", "ready"), 1);
    let again = env.run(&["run-now", "--job", &id]).expect_code(0);
    assert!(
        again.stdout.contains(&format!(
            "job {id} of queue \"later\" is already due (ready): nothing changed"
        )),
        "{}",
        again.stdout
    );
    // Second in its group: it waits for the first, not for its time.
    let enqueue_grouped = || {
        env.run(&["enqueue", "--queue", "later", "--group", "g", "--", "true"])
            .expect_code(0)
            .stdout
            .trim()
            .to_owned()
    };
    enqueue_grouped();
    let second = enqueue_grouped();
    let out = env.run(&["run-now", "--job", &second]).expect_code(0);
    assert!(
        out.stdout
            .contains("waits for its group or its stage, not its time"),
        "{}",
        out.stdout
    );
}

#[test]
fn status_lists_running_jobs_with_worker_and_start() {
    let env = Env::new();
    let pidfile = env.path("started");
    let command = format!("touch {}; exec sleep 60", pidfile.display());
    env.run(&[
        "enqueue", "--queue", "st", "--name", "sleeper", "--", &command,
    ])
    .expect_code(0);
    let mut worker = Reap(Some(env.spawn(&[
        "work",
        "--queue",
        "st",
        "--name",
        "w-test",
        "--shutdown-timeout",
        "100ms",
    ])));
    eventually("the command to start", Duration::from_secs(20), || {
        pidfile.exists().then_some(())
    });
    let text = eventually(
        "status to list the running job",
        Duration::from_secs(10),
        || {
            let out = env.run(&["status", "st"]).expect_code(0).stdout;
            out.contains("running now:\n").then_some(out)
        },
    );
    let row = text
        .lines()
        .find(|l| l.contains("sleeper"))
        .expect("running row");
    assert!(row.contains("w-test"), "{row}");
    // The start time shown is the attempt's start (to the second; RFC 3339, UTC).
    let json = env.status("st");
    let started = json["running"][0]["started_at"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(row.contains(&started[..19]), "{row} lacks {started}");
    let (code, _) = terminate(worker.0.take().unwrap(), Duration::from_secs(20));
    assert_eq!(code, 0);
}

#[test]
fn a_failing_command_ends_dead_and_dead_retry_makes_it_ready() {
    let env = Env::new();
    let id = env
        .run(&[
            "enqueue",
            "--queue",
            "d",
            "--name",
            "bad",
            "--",
            "echo oops >&2; exit 7",
        ])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    let mut worker = Reap(Some(env.spawn(&["work", "--queue", "d"])));
    eventually("the job to be dead", Duration::from_secs(20), || {
        (env.count("d", "dead") == 1).then_some(())
    });
    let (code, _) = terminate(worker.0.take().unwrap(), Duration::from_secs(20));
    assert_eq!(code, 0);

    let list = env
        .run(&["dead", "list", "--queue", "d"])
        .expect_code(0)
        .stdout;
    let row = list
        .lines()
        .find(|l| l.contains(" bad "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        row.contains(&id) && row.contains("1/1") && row.contains("exit status 7"),
        "{row}"
    );
    let shown = env.run(&["job", &id, "--queue", "d"]).expect_code(0).stdout;
    assert!(
        shown.contains("    exit status 7\n    --- output ---\n    oops\n"),
        "{shown}"
    );

    let out = env
        .run(&["dead", "retry", "--queue", "d", &id])
        .expect_code(0);
    assert!(
        out.stdout
            .contains("1 dead job(s) of queue \"d\" are ready again"),
        "{}",
        out.stdout
    );
    assert_eq!(env.count("d", "dead"), 0);
    assert_eq!(env.count("d", "ready"), 1);
}

/// `GET /metrics` on `port`, the body.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// `relayq work --metrics ADDR` serves the worker's counters as Prometheus text on
/// loopback, and refuses any other address (the endpoint has no token).
#[test]
fn work_serves_its_counters_at_metrics_on_loopback() {
    let env = Env::new();
    let refused = env
        .run(&["work", "--metrics", "0.0.0.0:9", "-q", "m"])
        .expect_code(2);
    assert!(refused.stderr.contains("loopback"), "{}", refused.stderr);
    env.run(&["enqueue", "-q", "m", "--", "true"])
        .expect_code(0);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let worker = Reap(Some(env.spawn(&[
        "work",
        "-q",
        "m",
        "--name",
        "w1",
        "--metrics",
        &addr,
    ])));
    let text = eventually(
        "the completion in /metrics",
        Duration::from_secs(30),
        || {
            scrape(port).filter(|t| {
                t.contains(
                    r#"relayq_worker_settled_total{queue="m",outcome="succeeded",worker="w1"} 1"#,
                )
            })
        },
    );
    assert!(
        text.contains(r#"relayq_worker_claimed_total{queue="m",worker="w1"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"relayq_worker_handler_seconds_count{queue="m",outcome="succeeded",worker="w1"} 1"#
        ),
        "{text}"
    );
    // A histogram, whose buckets add up across workers, and described.
    assert!(
        text.contains(
            r#"relayq_worker_handler_seconds_bucket{queue="m",outcome="succeeded",worker="w1",le="+Inf"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains("# HELP relayq_worker_claimed_total Jobs claimed, by queue."),
        "{text}"
    );
    let mut worker = worker;
    let (code, _) = terminate(worker.0.take().expect("running"), Duration::from_secs(20));
    assert_eq!(code, 0);
}
