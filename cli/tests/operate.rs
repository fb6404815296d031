//! The operator's verbs on every backend: `pause`, `resume`, `limit`,
//! `prune`, maintenance run by `relayq work`, `job ID` without a queue, `status --all`
//! and `--json` with every count. SQLite always; PostgreSQL and Redis where
//! `RELAYQ_POSTGRES_URL` / `RELAYQ_REDIS_URL` point. A backend whose server is not
//! configured is reported as ignored, or failed when `RELAYQ_REQUIRE` names it.

mod common;

use std::time::Duration;

use common::{Env, eventually};
use libtest_mimic::{Arguments, Failed};
use serde_json::Value;

type Case = fn(&Env) -> Result<(), Failed>;

const CASES: &[(&str, Case)] = &[
    (
        "pause_resume_and_limit_show_in_status",
        pause_resume_and_limit,
    ),
    ("key_limits_are_set_and_shown", key_limits_set_and_shown),
    ("rates_are_set_and_shown", rates_set_and_shown),
    ("key_rates_are_set_and_shown", key_rates_set_and_shown),
    (
        "prune_deletes_only_finished_jobs",
        prune_deletes_only_finished,
    ),
    ("work_prunes_on_a_timer", work_prunes_on_a_timer),
    ("job_is_found_by_id_alone", job_by_id_alone),
    (
        "status_json_has_every_count_and_all_lists_queues",
        status_counts_and_all,
    ),
    ("the_example_plan_runs", the_example_plan_runs),
    (
        "job_output_cannot_drive_the_terminal",
        job_output_cannot_drive_the_terminal,
    ),
    (
        "a_command_reports_progress_and_leaves_a_result",
        progress_and_result,
    ),
];

fn main() {
    libtest_mimic::run(&Arguments::from_args(), common::per_backend(CASES)).exit();
}

/// A queue name no other test or run uses.
fn queue(tag: &str) -> String {
    format!("op-{tag}-{:08x}", fastrand::u32(..))
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn json(env: &Env, args: &[&str]) -> Result<Value, Failed> {
    let out = env.run(args);
    check(out.code == 0, || {
        format!("{args:?} exited {}: {}", out.code, out.stderr)
    })?;
    serde_json::from_str(&out.stdout)
        .map_err(|e| format!("{args:?}: not JSON ({e}): {}", out.stdout).into())
}

fn enqueue(env: &Env, q: &str, extra: &[&str]) -> Result<i64, Failed> {
    let mut args = vec!["enqueue", "-q", q];
    args.extend_from_slice(extra);
    let out = env.run(&args);
    check(out.code == 0, || {
        format!("enqueue exited {}: {}", out.code, out.stderr)
    })?;
    out.stdout
        .trim()
        .parse()
        .map_err(|_| format!("enqueue printed {:?}, not an id", out.stdout).into())
}

/// `relayq limit N --key K` and `--each-key` store per-key limits, `enqueue
/// --limit-key` tags a job, and `status` shows each key's running count and limit.
fn key_limits_set_and_shown(env: &Env) -> Result<(), Failed> {
    let q = queue("keys");
    let first = env.run(&["enqueue", "-q", &q, "--limit-key", "db-a", "--", "true"]);
    if first.code == 2 && first.stderr.contains("does not keep limit keys") {
        return Err(common::skipped("the backend keeps no limit keys (SPEC K)"));
    }
    check(first.code == 0, || {
        format!("enqueue --limit-key: {}", first.stderr)
    })?;
    env.run(&["limit", "2", "--each-key", "-q", &q])
        .expect_code(0);
    env.run(&["limit", "1", "--key", "db-a", "-q", &q])
        .expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    let keys = &s["keys"];
    check(
        keys["default"] == 2
            && keys["keys"][0]["key"] == "db-a"
            && keys["keys"][0]["limit"] == 1
            && keys["keys"][0]["running"] == 0,
        || format!("after limit 2 --each-key and limit 1 --key db-a: {s}"),
    )?;
    let text = env.run(&["status", "-q", &q]);
    check(
        text.stdout.contains("every limit key: at most 2 running") && text.stdout.contains("db-a"),
        || format!("status text: {}", text.stdout),
    )?;
    let zero = env.run(&["limit", "0", "--key", "db-a", "-q", &q]);
    check(zero.code == 2, || {
        format!(
            "limit 0 --key should be refused: {} {}",
            zero.code, zero.stderr
        )
    })?;
    env.run(&["limit", "none", "--key", "db-a", "-q", &q])
        .expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(
        s["keys"]["keys"].as_array().is_some_and(Vec::is_empty),
        || format!("after limit none --key db-a: {s}"),
    )?;
    Ok(())
}

/// `relayq limit --rate N/T [--burst B]` stores a queue's rate, `status` shows it,
/// bad rates are refused with nothing stored, and `--rate none` lifts it (SPEC K8).
fn rates_set_and_shown(env: &Env) -> Result<(), Failed> {
    let q = queue("rates");
    enqueue(env, &q, &["--", "true"])?;
    let set = env.run(&["limit", "--rate", "5/1s", "-q", &q]);
    if set.code != 0 && set.stderr.contains("does not keep rates") {
        return Err(common::skipped("the backend keeps no rates (SPEC K8)"));
    }
    check(set.code == 0, || {
        format!("limit --rate 5/1s: {}", set.stderr)
    })?;
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(s["stats"]["rate"] == "5/1s", || {
        format!("after limit --rate 5/1s: {s}")
    })?;
    env.run(&["limit", "--rate", "600/1m", "--burst", "3", "-q", &q])
        .expect_code(0);
    let text = env.run(&["status", "-q", &q]);
    check(text.stdout.contains("rate: at most 600/1m burst 3"), || {
        format!("status text: {}", text.stdout)
    })?;
    for bad in [
        &["--rate", "0/1s"][..],
        &["--rate", "5/0s"],
        &["--rate", "5/1s", "--burst", "6"],
        &["--rate", "fast"],
        &["--burst", "2"],
    ] {
        let mut args = vec!["limit", "-q", &q];
        args.extend_from_slice(bad);
        let out = env.run(&args);
        check(out.code == 2, || {
            format!("{bad:?} should be refused: {} {}", out.code, out.stderr)
        })?;
    }
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(s["stats"]["rate"] == "600/1m burst 3", || {
        format!("a refused rate changed the stored one: {s}")
    })?;
    env.run(&["limit", "--rate", "none", "-q", &q])
        .expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(s["stats"]["rate"].is_null(), || {
        format!("after limit --rate none: {s}")
    })?;
    Ok(())
}

/// `relayq limit --rate N/T --each-key` and `--key K` store limit keys' rates, a
/// worker's start shows as the key's next start in `status` (text and JSON), bad rates
/// are refused, and `--rate none` lifts them (SPEC K12, K14).
fn key_rates_set_and_shown(env: &Env) -> Result<(), Failed> {
    let q = queue("krates");
    let first = env.run(&["enqueue", "-q", &q, "--limit-key", "db-a", "--", "true"]);
    if first.code == 2 && first.stderr.contains("does not keep limit keys") {
        return Err(common::skipped("the backend keeps no limit keys (SPEC K)"));
    }
    enqueue(env, &q, &["--limit-key", "db-a", "--", "true"])?;
    let set = env.run(&["limit", "--rate", "5/1h", "--each-key", "-q", &q]);
    if set.code != 0 && set.stderr.contains("keeps no rates") {
        return Err(common::skipped("the backend keeps no key rates (SPEC K12)"));
    }
    check(set.code == 0, || {
        format!("limit --rate 5/1h --each-key: {}", set.stderr)
    })?;
    env.run(&["limit", "--rate", "1/1h", "--key", "db-a", "-q", &q])
        .expect_code(0);
    // One job starts; the key's rate holds the other an hour.
    let mut worker = env.spawn(&["work", "-q", &q, "--shutdown-timeout", "1s"]);
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eventually("one job to succeed", Duration::from_secs(60), || {
            let s = json(env, &["status", "-q", &q, "--json"]).ok()?;
            (s["stats"]["counts"]["succeeded"] == 1).then_some(())
        });
    }));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(worker.id()).unwrap_or(0)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = worker.wait();
    done.map_err(|_| "no job succeeded under the key's rate")?;
    let s = json(env, &["status", "-q", &q, "--json"])?;
    let keys = &s["keys"];
    check(
        keys["default_rate"] == "5/1h"
            && keys["keys"][0]["key"] == "db-a"
            && keys["keys"][0]["own_rate"] == "1/1h"
            && keys["keys"][0]["rate"] == "1/1h"
            && keys["keys"][0]["rate_next"].is_string()
            && s["stats"]["counts"]["succeeded"] == 1,
        || format!("after limit --rate 1/1h --key db-a and a drain: {s}"),
    )?;
    let text = env.run(&["status", "-q", &q]);
    check(
        text.stdout.contains("every limit key: at most 5/1h starts")
            && text.stdout.contains("1/1h")
            && text.stdout.contains("next start"),
        || format!("status text: {}", text.stdout),
    )?;
    for bad in [
        &["--rate", "0/1s", "--key", "db-a"][..],
        &["--rate", "5/1s", "--burst", "6", "--each-key"],
    ] {
        let mut args = vec!["limit", "-q", &q];
        args.extend_from_slice(bad);
        let out = env.run(&args);
        check(out.code == 2, || {
            format!("{bad:?} should be refused: {} {}", out.code, out.stderr)
        })?;
    }
    env.run(&["limit", "--rate", "none", "--key", "db-a", "-q", &q])
        .expect_code(0);
    env.run(&["limit", "--rate", "none", "--each-key", "-q", &q])
        .expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(
        s["keys"]["default_rate"].is_null()
            && s["keys"]["keys"].as_array().is_some_and(Vec::is_empty),
        || format!("after the key rates were lifted: {s}"),
    )?;
    Ok(())
}

fn pause_resume_and_limit(env: &Env) -> Result<(), Failed> {
    let q = queue("verbs");
    enqueue(env, &q, &["--", "true"])?;
    env.run(&["pause", "-q", &q]).expect_code(0);
    env.run(&["limit", "3", "-q", &q]).expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(
        s["stats"]["paused"] == true && s["stats"]["max_running"] == 3,
        || format!("after pause and limit 3: {s}"),
    )?;
    let zero = env.run(&["limit", "0", "-q", &q]);
    check(zero.code == 2 && zero.stderr.contains("pause"), || {
        format!(
            "limit 0 should be refused, pointing at pause: {} {}",
            zero.code, zero.stderr
        )
    })?;
    // A name nothing uses is refused (a typo would create a queue and change nothing),
    // unless --new says the queue is set up before its first job.
    let typo = format!("{q}x");
    for args in [["pause", "-q", &typo], ["limit", "2", "-q"]] {
        let mut args: Vec<&str> = args.to_vec();
        if args[0] == "limit" {
            args.push(&typo);
        }
        let out = env.run(&args);
        check(
            out.code == 2 && out.stderr.contains("--new") && out.stderr.contains(&q),
            || {
                format!(
                    "{args:?} should be refused, naming the queues in use: {} {}",
                    out.code, out.stderr
                )
            },
        )?;
    }
    let s = json(env, &["status", "--all", "--json"])?;
    check(!s.to_string().contains(&typo), || {
        format!("a refused setting created queue {typo}: {s}")
    })?;
    env.run(&["pause", "-q", &typo, "--new"]).expect_code(0);
    let s = json(env, &["status", "-q", &typo, "--json"])?;
    check(s["stats"]["paused"] == true, || format!("pause --new: {s}"))?;
    env.run(&["resume", "-q", &q]).expect_code(0);
    env.run(&["limit", "none", "-q", &q]).expect_code(0);
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(
        s["stats"]["paused"] == false && s["stats"]["max_running"].is_null(),
        || format!("after resume and limit none: {s}"),
    )?;
    // Resumed, its job waits and no worker serves the queue: status says so.
    let out = env.run(&["status", "-q", &q]);
    check(
        out.code == 0 && out.stdout.contains("warning: no worker serves this queue"),
        || format!("status of an unserved queue: {} {}", out.code, out.stdout),
    )
}

fn prune_deletes_only_finished(env: &Env) -> Result<(), Failed> {
    let q = queue("prune");
    let mut done = Vec::new();
    for _ in 0..3 {
        done.push(enqueue(env, &q, &["--", "true"])?);
    }
    let later = enqueue(env, &q, &["--delay", "1h", "--", "true"])?;
    for id in &done {
        env.run(&["cancel", "-q", &q, "--job", &id.to_string()])
            .expect_code(0);
    }
    let kept = json(env, &["prune", "-q", &q, "--json"])?;
    check(kept["pruned"] == 0, || {
        format!("the default 7-day retention pruned: {kept}")
    })?;
    let out = json(env, &["prune", "-q", &q, "--older-than", "0s", "--json"])?;
    check(out["pruned"] == 3, || {
        format!("prune --older-than 0s: {out}")
    })?;
    let s = json(env, &["status", "-q", &q, "--json"])?;
    check(
        s["stats"]["total"] == 1 && s["stats"]["counts"]["scheduled"] == 1,
        || format!("only the delayed job should be left: {s}"),
    )?;
    let job = json(env, &["job", &later.to_string(), "-q", &q, "--json"])?;
    check(job["state"] == "scheduled", || {
        format!("the delayed job: {job}")
    })
}

fn work_prunes_on_a_timer(env: &Env) -> Result<(), Failed> {
    let q = queue("timer");
    for _ in 0..5 {
        enqueue(env, &q, &["--", "true"])?;
    }
    enqueue(env, &q, &["--delay", "1h", "--", "true"])?;
    let mut worker = env.spawn(&[
        "work",
        "-q",
        &q,
        "--retention",
        "0s",
        "--maintain-every",
        "200ms",
        "--shutdown-timeout",
        "1s",
    ]);
    let left = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eventually(
            "the worker to run and prune the 5 jobs",
            Duration::from_secs(60),
            || {
                let s = env.status(&q);
                (s["stats"]["total"] == 1).then_some(s)
            },
        )
    }));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(worker.id()).unwrap_or(0)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = worker.wait();
    let s = left.map_err(|_| "the worker did not prune its finished jobs in 60 s")?;
    check(s["stats"]["counts"]["scheduled"] == 1, || {
        format!("the delayed job should be all that is left: {s}")
    })
}

fn job_by_id_alone(env: &Env) -> Result<(), Failed> {
    let q = queue("byid");
    let id = enqueue(env, &q, &["--name", "find-me", "--", "true"])?.to_string();
    let out = env.run(&["job", &id, "--json"]);
    if env.db.starts_with("redis") {
        // Ids count per queue on Redis: this id is likely in other queues too.
        if out.code == 2 {
            return check(out.stderr.contains(&q) && out.stderr.contains("-q"), || {
                format!(
                    "an id in several queues should name them and ask for -q: {}",
                    out.stderr
                )
            });
        }
    }
    check(out.code == 0, || {
        format!("job {id} without -q exited {}: {}", out.code, out.stderr)
    })?;
    let job: Value = serde_json::from_str(&out.stdout)?;
    check(job["name"] == "find-me", || format!("job {id}: {job}"))?;
    let text = env.run(&["job", &id]).expect_code(0).stdout;
    check(text.contains(&format!("of queue {q:?}")), || {
        format!("job {id}: {text}")
    })?;
    let missing = env.run(&["job", "999999999"]);
    check(
        missing.code == 2 && missing.stderr.contains("not found"),
        || format!("an unknown id: {} {}", missing.code, missing.stderr),
    )
}

/// SPEC L7, L8: a command's `relayq-progress` lines on `$RELAYQ_PROGRESS_FD` show in
/// `relayq job` and `relayq status` while it runs; its last output lines are its result.
fn progress_and_result(env: &Env) -> Result<(), Failed> {
    let q = queue("progress");
    let go = env.path("go");
    let command = format!(
        "echo 'relayq-progress 40 copying table x' >&\"$RELAYQ_PROGRESS_FD\"; \
         while [ ! -e {} ]; do sleep 0.05; done; echo first; echo second",
        go.display()
    );
    let id = enqueue(env, &q, &["--", &command])?.to_string();
    let mut worker = env.spawn(&["work", "-q", &q, "--shutdown-timeout", "1s"]);
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let job = eventually(
            "the progress in `relayq job`",
            Duration::from_secs(60),
            || {
                let job = json(env, &["job", &id, "-q", &q, "--json"]).ok()?;
                (job["progress"]["percent"] == 40).then_some(job)
            },
        );
        let table = env.run(&["status", "-q", &q]).expect_code(0).stdout;
        std::fs::write(&go, "").expect("write the go file");
        let done = eventually("the job to succeed", Duration::from_secs(60), || {
            let job = json(env, &["job", &id, "-q", &q, "--json"]).ok()?;
            (job["state"] == "succeeded").then_some(job)
        });
        (job, table, done)
    }));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(worker.id()).unwrap_or(0)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = worker.wait();
    let (job, table, done) = seen.map_err(|_| "the progress or the success never showed")?;
    check(job["progress"]["message"] == "copying table x", || {
        format!("progress: {}", job["progress"])
    })?;
    check(table.contains("40% copying table x"), || {
        format!("status shows no progress: {table}")
    })?;
    check(done["result"] == "first\nsecond\n", || {
        format!("result: {}", done["result"])
    })?;
    let text = env.run(&["job", &id, "-q", &q]).expect_code(0).stdout;
    check(
        text.contains("progress: 40% copying table x (attempt 1)") && text.contains("result"),
        || format!("relayq job: {text}"),
    )
}

/// What a job printed (escape sequences, carriage returns, a bell) reaches the
/// operator's terminal written out, never as raw control bytes.
fn job_output_cannot_drive_the_terminal(env: &Env) -> Result<(), Failed> {
    let q = queue("ctl");
    let plan = env.path("ctl.toml");
    std::fs::write(
        &plan,
        "[[job]]\nname = \"noisy\"\nmax_attempts = 1\n\
         command = \"printf '\\\\033[2J\\\\033[31mred\\\\rX\\\\007\\\\n'; exit 3\"\n",
    )?;
    let (run, report) = env.run_plan(&plan, &["-q", &q]);
    check(run.code == 1, || {
        format!("the failing plan exited {}: {}", run.code, run.stderr)
    })?;
    check(
        !run.stdout.contains('\u{1b}') && !run.stderr.contains('\u{1b}'),
        || format!("run's summary printed raw escapes: {:?}", run.stdout),
    )?;
    let id = report["jobs"][0]["id"].to_string();
    let text = env.run(&["job", &id, "-q", &q]).expect_code(0).stdout;
    check(text.contains("red") && text.contains(r"\u{1b}[31m"), || {
        format!("the output should be shown, its escapes written out: {text:?}")
    })?;
    check(!text.contains(['\u{1b}', '\r', '\u{7}']), || {
        format!("raw control bytes reached the terminal: {text:?}")
    })
}

fn status_counts_and_all(env: &Env) -> Result<(), Failed> {
    let q = queue("all");
    enqueue(env, &q, &["--", "true"])?;
    let s = json(env, &["status", "-q", &q, "--json"])?;
    let counts = s["stats"]["counts"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for state in [
        "scheduled",
        "ready",
        "blocked",
        "running",
        "retrying",
        "succeeded",
        "dead",
        "cancelled",
    ] {
        check(counts.get(state).is_some_and(Value::is_u64), || {
            format!("status --json lacks the count of {state}: {s}")
        })?;
    }
    check(counts["ready"] == 1 && counts["dead"] == 0, || {
        format!("{s}")
    })?;
    // One ready job waits: its wait is a number of seconds, never negative.
    check(
        s["stats"]["oldest_ready_seconds"]
            .as_f64()
            .is_some_and(|w| w >= 0.0),
        || format!("status --json lacks the oldest ready job's wait: {s}"),
    )?;
    let all = json(env, &["status", "--all", "--json"])?;
    let row = all
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["queue"] == q.as_str()))
        .cloned();
    check(row.is_some_and(|r| r["counts"]["ready"] == 1), || {
        format!("status --all --json lacks queue {q}: {all}")
    })?;
    let text = env.run(&["status", "--all"]).expect_code(0).stdout;
    check(text.contains(&q), || {
        format!("status --all lacks {q}: {text}")
    })?;
    let dead = json(env, &["dead", "list", "-q", &q, "--json"])?;
    check(dead.as_array().is_some_and(Vec::is_empty), || {
        format!("dead list --json: {dead}")
    })
}

/// The example plan, in a queue of its own (unique on a server that keeps earlier
/// runs' queues): every job succeeds.
fn the_example_plan_runs(env: &Env) -> Result<(), Failed> {
    let q = queue("plan");
    let plan = common::example("plan.toml");
    let out = env.run(&["run", plan.to_str().unwrap(), "--queue", &q]);
    check(
        out.code == 0 && out.stdout.contains(": 13 succeeded, 0 dead, 0 cancelled"),
        || format!("exited {}: {}{}", out.code, out.stdout, out.stderr),
    )?;
    let done = env.count(&q, "succeeded");
    check(done == 13, || format!("{done} succeeded"))
}
