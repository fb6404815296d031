//! `relayq schedule ...` with `relayq work` firing the slots, against one SQLite file.

mod common;

use std::time::Duration;

use common::{Env, eventually, example};
use serde_json::Value;

fn listed(env: &Env, queue: &str) -> Vec<Value> {
    env.run(&["schedule", "list", "--queue", queue, "--json"])
        .expect_code(0)
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn bad_schedules_name_their_flag_and_store_nothing() {
    let env = Env::new();
    env.run(&[
        "schedule",
        "add",
        "ok",
        "-q",
        "s",
        "--cron",
        "0 2 * * *",
        "--",
        "true",
    ])
    .expect_code(0);
    for (args, flag) in [
        (vec!["--cron", "61 * * * *"], "--cron"),
        (vec!["--cron", "* * * * *", "--tz", "Mars/Olympus"], "--tz"),
        (
            vec!["--cron", "* * * * *", "--catch-up", "soon"],
            "--catch-up",
        ),
    ] {
        let mut all = vec!["schedule", "add", "bad", "-q", "s"];
        all.extend(args);
        all.extend(["--", "true"]);
        let out = env.run(&all).expect_code(2);
        assert!(out.stderr.contains(flag), "{flag}: {}", out.stderr);
    }
    let names: Vec<Value> = listed(&env, "s")
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, [Value::from("ok")], "nothing bad was stored");
}

#[test]
fn a_plan_schedule_runs_now_and_a_command_schedule_fires_under_work() {
    let env = Env::new();
    let plan = example("plan.toml");
    env.run(&[
        "schedule",
        "add",
        "nightly",
        "-q",
        "s",
        "--cron",
        "0 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--plan",
        plan.to_str().unwrap(),
    ])
    .expect_code(0);
    let out = env
        .run(&["schedule", "run-now", "nightly", "-q", "s"])
        .expect_code(0);
    assert!(
        out.stdout.starts_with("batch "),
        "run-now made a batch: {}",
        out.stdout
    );
    env.run(&[
        "schedule",
        "add",
        "tick",
        "-q",
        "s",
        "--cron",
        "* * * * * *",
        "--",
        "true",
    ])
    .expect_code(0);
    env.run(&["schedule", "pause", "nightly", "-q", "s"])
        .expect_code(0);
    let mut worker = env.spawn(&["work", "-q", "s", "--concurrency", "4"]);
    let tick_job = |env: &Env| -> Option<i64> {
        let s = listed(env, "s");
        s.iter().find(|s| s["name"] == "tick")?["last_job"].as_i64()
    };
    let first = eventually(
        "the per-second schedule to fire",
        Duration::from_secs(30),
        || tick_job(&env),
    );
    eventually("it to fire again", Duration::from_secs(30), || {
        tick_job(&env).filter(|j| *j != first)
    });
    let ticks = listed(&env, "s");
    let nightly = ticks
        .iter()
        .find(|s| s["name"] == "nightly")
        .expect("listed");
    assert_eq!(nightly["paused"], Value::Bool(true));
    assert!(nightly["next_slot"].is_null(), "paused: no next slot");
    worker.kill().ok();
    worker.wait().ok();
    env.run(&["schedule", "rm", "tick", "-q", "s"])
        .expect_code(0);
    let out = env
        .run(&["schedule", "rm", "tick", "-q", "s"])
        .expect_code(2);
    assert!(out.stderr.contains("tick"), "{}", out.stderr);
}
