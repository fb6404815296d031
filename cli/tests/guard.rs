//! The guard of every command: a command never outlives its worker
//! (SIGKILL of `relayq work`) nor its lease (a worker frozen by SIGSTOP), and a cancel
//! from another process kills it at once (SPEC B8), on SQLite and,
//! when their URLs are set, PostgreSQL and Redis. Real processes; every wait polls with
//! a deadline.

mod common;

use std::{
    process::Child,
    time::{Duration, Instant},
};

use common::{Env, eventually};
use libtest_mimic::{Arguments, Failed};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

const CASES: &[(&str, Case)] = &[
    (
        "sigkill_of_the_worker_leaves_no_command_running_a_second_later",
        sigkill_of_the_worker,
    ),
    (
        "a_worker_frozen_past_its_lease_leaves_no_command_beside_the_next_attempt",
        a_worker_frozen_past_its_lease,
    ),
    (
        "a_cancel_from_another_process_kills_the_command_long_before_a_heartbeat",
        a_cancel_kills_the_command,
    ),
];

type Case = fn(&Env) -> Result<(), Failed>;

/// SQLite always; PostgreSQL and Redis when `RELAYQ_POSTGRES_URL` / `RELAYQ_REDIS_URL`
/// name a server (else reported as ignored).
fn main() {
    libtest_mimic::run(&Arguments::from_args(), common::per_backend(CASES)).exit();
}

fn queue() -> String {
    format!("guard-{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// Whether process `pid` has ended (gone, or a zombie waiting to be reaped).
fn ended(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
    })
}

/// Workers killed (and thawed first) however the test ends.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn pid_of(c: &Child) -> Pid {
    Pid::from_raw(i32::try_from(c.id()).expect("pid"))
}

/// Reads whitespace-separated pids from `file` once it is complete (ends with "end").
fn pids(env: &Env, file: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(env.path(file)).ok()?;
    let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    (words.last().map(String::as_str) == Some("end")).then(|| words[..words.len() - 1].to_vec())
}

fn sigkill_of_the_worker(env: &Env) -> Result<(), Failed> {
    {
        let q = queue();
        let marker = format!("pids-{q}");
        // The shell and a background grandchild record their pids, then wait.
        let cmd = format!("sleep 300 & echo $$ $! end > {marker}; wait");
        env.run(&["enqueue", "--queue", &q, "--", &cmd])
            .expect_code(0);
        let mut workers = Workers(vec![env.spawn(&["work", "--queue", &q, "--lease", "3s"])]);
        let pids = eventually("the command started", Duration::from_secs(20), || {
            pids(env, &marker)
        });
        assert_eq!(pids.len(), 2, "{pids:?}");
        assert!(pids.iter().all(|p| !ended(p)), "not running yet");
        workers.0[0].kill().expect("SIGKILL the worker");
        let killed = Instant::now();
        workers.0[0].wait().expect("reap the worker");
        // Within a second: the guard saw its pipe close and killed the group.
        let deadline = killed + Duration::from_secs(1);
        while !pids.iter().all(|p| ended(p)) {
            assert!(
                Instant::now() < deadline,
                "the command {pids:?} outlived its worker by a second"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

fn a_worker_frozen_past_its_lease(env: &Env) -> Result<(), Failed> {
    {
        let q = queue();
        let (first, second) = (format!("first-{q}"), format!("second-{q}"));
        // Attempt 1 records its shell's and grandchild's pids and runs on; attempt 2
        // records the state of those processes as it starts ("" gone, "Z" a zombie).
        let cmd = format!(
            "if [ -f {first} ]; then for p in $(cat {first}); do \
               s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); echo \"$p:$s\"; done > {second}.tmp; \
               mv {second}.tmp {second}; exit 0; fi; \
             sleep 300 & echo $$ $! > {first}; wait"
        );
        env.run(&["enqueue", "--queue", &q, "--max-attempts", "2", "--", &cmd])
            .expect_code(0);
        // One slot, so that once attempt 1 runs the worker claims nothing: a worker
        // frozen inside a SQLite write transaction (a claim) would hold the database's
        // one write lock, and no other process could claim until it resumed.
        let mut workers = Workers(vec![env.spawn(&[
            "work",
            "--queue",
            &q,
            "--lease",
            "2s",
            "--concurrency",
            "1",
        ])]);
        eventually("attempt 1 started", Duration::from_secs(20), || {
            std::fs::read_to_string(env.path(&first))
                .ok()
                .filter(|t| t.split_whitespace().count() == 2)
        });
        // Frozen, as Ctrl-Z would: no heartbeat, no renewal to the guard.
        kill(pid_of(&workers.0[0]), Signal::SIGSTOP).expect("SIGSTOP the worker");
        workers
            .0
            .push(env.spawn(&["work", "--queue", &q, "--lease", "2s"]));
        let seen = eventually("attempt 2 ran", Duration::from_secs(30), || {
            std::fs::read_to_string(env.path(&second)).ok()
        });
        let states: Vec<&str> = seen.lines().collect();
        assert_eq!(states.len(), 2, "{seen:?}");
        for line in states {
            let state = line.split(':').nth(1).unwrap_or("");
            assert!(
                state.is_empty() || state == "Z",
                "attempt 1's process ran beside attempt 2: {line}"
            );
        }
    }
    Ok(())
}

fn a_cancel_kills_the_command(env: &Env) -> Result<(), Failed> {
    let q = queue();
    let marker = format!("pids-{q}");
    let cmd = format!("sleep 300 & echo $$ $! end > {marker}; wait");
    let out = env
        .run(&["enqueue", "--queue", &q, "--", &cmd])
        .expect_code(0);
    let id = out.stdout.trim().to_owned();
    // A 30 s lease: the first heartbeat comes 10 s after the claim, so only the pushed
    // cancel or the lease read can stop the command within the 2 s below.
    let _workers = Workers(vec![env.spawn(&["work", "--queue", &q, "--lease", "30s"])]);
    let pids = eventually("the command started", Duration::from_secs(20), || {
        pids(env, &marker)
    });
    env.run(&["cancel", "-q", &q, "--job", &id]).expect_code(0);
    let cancelled = Instant::now();
    let deadline = cancelled + Duration::from_secs(2);
    while !pids.iter().all(|p| ended(p)) {
        assert!(
            Instant::now() < deadline,
            "the cancelled command {pids:?} still ran 2 s after the cancel"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = env.run(&["job", &id, "-q", &q, "--json"]).expect_code(0);
    let job: serde_json::Value = serde_json::from_str(&out.stdout).expect("job JSON");
    assert_eq!(job["state"], "cancelled", "{job}");
    let attempts = job["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{job}");
    assert_eq!(attempts[0]["outcome"], "cancelled", "{job}");
    Ok(())
}
