//! `relayq run` on the example plans: stage order, groups, summary, exit codes, and what
//! `status`, `wait`, `job` and `dead` say afterwards.

mod common;

use std::time::Duration;

use common::{Env, example, job, time};
use serde_json::Value;

fn jobs(report: &Value) -> &Vec<Value> {
    report["jobs"].as_array().expect("jobs")
}

fn stage(j: &Value) -> i64 {
    j["stage"].as_i64().expect("stage")
}

#[test]
fn the_example_plan_runs_every_stage_after_the_ones_below_it() {
    let env = Env::new();
    let (run, report) = env.run_plan(&example("plan.toml"), &[]);
    let run = run.expect_code(0);
    let jobs = jobs(&report);
    assert_eq!(jobs.len(), 13);
    let mut per_stage = std::collections::BTreeMap::new();
    for j in jobs {
        assert_eq!(j["state"], "succeeded", "{j}");
        *per_stage.entry(stage(j)).or_insert(0) += 1;
    }
    // A successful command's output is kept in the execution log.
    let extract_a = jobs
        .iter()
        .find(|j| j["name"] == "extract-a")
        .expect("extract-a");
    assert_eq!(
        extract_a["attempts"][0]["output"], "extracted a\n",
        "{extract_a}"
    );
    assert_eq!(
        per_stage.into_iter().collect::<Vec<_>>(),
        vec![(100, 7), (200, 2), (300, 1), (400, 2), (500, 1)]
    );
    // Every job of a stage started after every job of every lower stage ended.
    for later in jobs {
        let started = time(&later["attempts"][0]["started_at"]);
        for earlier in jobs.iter().filter(|e| stage(e) < stage(later)) {
            let ended = time(&earlier["finished_at"]);
            assert!(
                started >= ended,
                "{} (stage {}) started at {started} before {} (stage {}) ended at {ended}",
                later["name"],
                stage(later),
                earlier["name"],
                stage(earlier)
            );
        }
    }
    // The summary names every job and ends with the totals.
    for j in jobs {
        let name = j["name"].as_str().unwrap();
        assert!(
            run.stdout.contains(name),
            "{name} missing from\n{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("13 jobs in "), "{}", run.stdout);
    assert!(
        run.stdout.contains(": 13 succeeded, 0 dead, 0 cancelled"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("timeline: 0 → "), "{}", run.stdout);
    assert!(run.stdout.contains("stage 300 join"), "{}", run.stdout);
    // Stdout is not a terminal here: progress comes as plain lines, one per job as it
    // ends.
    assert!(
        run.stdout.contains("ok      stage 500  report  in "),
        "{}",
        run.stdout
    );
    let ended = run
        .stdout
        .lines()
        .filter(|l| l.contains(" ok      stage "))
        .count();
    assert_eq!(ended, 13, "one line per job:\n{}", run.stdout);
    assert!(
        !run.stdout.contains(" start   "),
        "no start lines:\n{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("stage 100 finished: 7 succeeded"),
        "{}",
        run.stdout
    );
}

#[test]
fn the_example_group_never_overlaps_and_runs_in_plan_order() {
    let env = Env::new();
    let (run, report) = env.run_plan(&example("plan.toml"), &["--workers", "8"]);
    run.expect_code(0);
    let group: Vec<&Value> = jobs(&report)
        .iter()
        .filter(|j| j["group"] == "orders-table")
        .collect();
    assert_eq!(group.len(), 3);
    for pair in group.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a["id"].as_i64() < b["id"].as_i64());
        let a_end = time(&a["finished_at"]);
        let b_start = time(&b["attempts"][0]["started_at"]);
        assert!(
            b_start >= a_end,
            "{} started at {b_start} before {} ended at {a_end}",
            b["name"],
            a["name"]
        );
    }
    // With 8 slots the extracts ran alongside the group: the group did not hold them up.
    let extract_start = time(&job(&report, "extract-b")["attempts"][0]["started_at"]);
    let second_migration = time(&job(&report, "migrate-orders-2")["attempts"][0]["started_at"]);
    assert!(extract_start < second_migration);
}

/// A plan whose commands log their own start and end (nanoseconds, their own clock).
fn logging_plan(log: &std::path::Path) -> String {
    let mut plan = String::new();
    let jobs = [
        ("a1", 10, None),
        ("a2", 10, None),
        ("a3", 10, None),
        ("g1", 10, Some("g")),
        ("g2", 10, Some("g")),
        ("g3", 10, Some("g")),
        ("b1", 20, None),
        ("b2", 20, None),
        ("c1", 30, Some("g")),
    ];
    for (name, stage, group) in jobs {
        let group = group.map_or_else(String::new, |g| format!("group = \"{g}\"\n"));
        plan.push_str(&format!(
            "[[job]]\nname = \"{name}\"\nstage = {stage}\n{group}command = \"echo $(date +%s%N) start {name} >> {log}; sleep 0.05; echo $(date +%s%N) end {name} >> {log}\"\n\n",
            log = log.display()
        ));
    }
    plan
}

#[test]
fn commands_themselves_see_stages_in_order_and_groups_apart() {
    let env = Env::new();
    let log = env.path("log");
    let plan = env.path("logging.toml");
    std::fs::write(&plan, logging_plan(&log)).unwrap();
    let (run, _) = env.run_plan(&plan, &["--workers", "6"]);
    run.expect_code(0);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut span = std::collections::HashMap::<String, (u128, u128)>::new();
    for line in text.lines() {
        let [t, what, name] = line.split(' ').collect::<Vec<_>>()[..] else {
            panic!("bad log line {line:?}")
        };
        let t: u128 = t.parse().unwrap();
        let e = span.entry(name.to_owned()).or_insert((0, 0));
        if what == "start" { e.0 = t } else { e.1 = t }
    }
    assert_eq!(span.len(), 9, "{text}");
    let stage_of = |n: &str| match &n[..1] {
        "a" | "g" => 10,
        "b" => 20,
        _ => 30,
    };
    for (later, (start, _)) in &span {
        for (earlier, (_, end)) in &span {
            if stage_of(earlier) < stage_of(later) {
                assert!(
                    start > end,
                    "{later} started before {earlier} ended:\n{text}"
                );
            }
        }
    }
    for pair in [("g1", "g2"), ("g2", "g3"), ("g3", "c1")] {
        assert!(
            span[pair.1].0 > span[pair.0].1,
            "{} overlapped {}:\n{text}",
            pair.1,
            pair.0
        );
    }
}

#[test]
fn status_and_wait_after_the_example_plan() {
    let env = Env::new();
    let (run, report) = env.run_plan(&example("plan.toml"), &[]);
    run.expect_code(0);
    let batch = report["batch"].as_i64().expect("batch id").to_string();

    let status = env.status("default");
    assert_eq!(status["stats"]["counts"]["succeeded"], 13);
    assert_eq!(status["running"].as_array().map(Vec::len), Some(0));

    let text = env.run(&["status"]).expect_code(0).stdout;
    assert!(text.contains("queue \"default\": 13 jobs"), "{text}");
    let succeeded = text
        .lines()
        .find(|l| l.contains("succeeded"))
        .expect("succeeded row");
    assert!(succeeded.contains("13"), "{succeeded}");
    assert!(text.contains("running now: none"), "{text}");
    // The newest batches show without naming one.
    assert!(
        text.contains(&format!(
            "batch {batch} \"nightly etl\" of queue \"default\": finished; on_failure = halt"
        )),
        "{text}"
    );
    assert_eq!(
        status["batches"][0]["batch"]["id"], report["batch"],
        "{status}"
    );

    let text = env
        .run(&["status", "--batch", &batch])
        .expect_code(0)
        .stdout;
    assert!(
        text.contains(&format!(
            "batch {batch} \"nightly etl\" of queue \"default\": finished; on_failure = halt"
        )),
        "{text}"
    );
    for (stage, n) in [
        ("100", "7"),
        ("200", "2"),
        ("300", "1"),
        ("400", "2"),
        ("500", "1"),
    ] {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(stage))
            .unwrap_or_else(|| panic!("no row for stage {stage} in\n{text}"));
        let cells: Vec<&str> = row
            .split(['│', '┆'])
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        // stage, pending, running, succeeded, dead, cancelled, total
        assert_eq!(cells, vec![stage, "0", "0", n, "0", "0", n], "{row}");
    }

    let out = env.run(&["wait", &batch, "--timeout", "5s"]).expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("batch {batch} is finished: every job succeeded")),
        "{}",
        out.stdout
    );
}

#[test]
fn the_failing_plan_retries_then_halts_later_stages() {
    let env = Env::new();
    let (run, report) = env.run_plan(&example("failing-plan.toml"), &[]);
    let run = run.expect_code(1);

    let bad = job(&report, "load-orders");
    assert_eq!(bad["state"], "dead");
    let attempts = bad["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "max_attempts = 2: {bad}");
    for a in attempts {
        assert_eq!(a["outcome"], "failed");
        let error = a["error"].as_str().unwrap();
        assert!(error.starts_with("exit status 3\n"), "{error}");
        assert!(
            error.contains("loading orders...\nerror: table orders is locked"),
            "{error}"
        );
    }
    assert_eq!(job(&report, "extract")["state"], "succeeded");
    for name in ["transform", "publish"] {
        let j = job(&report, name);
        assert_eq!(j["state"], "cancelled", "{j}");
        assert_eq!(j["attempts"].as_array().map(Vec::len), Some(0), "{j}");
    }
    assert_eq!(report["halted"], true);

    // The summary shows dead and cancelled jobs and the failed command's output.
    assert!(run.stdout.contains("dead: exit status 3"), "{}", run.stdout);
    assert!(run.stdout.contains("cancelled"), "{}", run.stdout);
    assert!(
        run.stdout.contains("is dead after 2 attempt(s)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("    error: table orders is locked"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("4 jobs in "), "{}", run.stdout);
    assert!(
        run.stdout.contains(": 1 succeeded, 1 dead, 2 cancelled"),
        "{}",
        run.stdout
    );

    // Afterwards: the counts, the dead job with its output, and wait reporting failure.
    assert_eq!(env.count("default", "dead"), 1);
    assert_eq!(env.count("default", "cancelled"), 2);
    let id = bad["id"].as_i64().unwrap().to_string();
    let dead = env.run(&["dead", "list"]).expect_code(0).stdout;
    let row = dead
        .lines()
        .find(|l| l.contains("load-orders"))
        .expect("dead row");
    assert!(
        row.contains(&id) && row.contains("2/2") && row.contains("exit status 3"),
        "{row}"
    );
    let shown = env.run(&["job", &id]).expect_code(0).stdout;
    assert!(shown.contains("error: table orders is locked"), "{shown}");
    let batch = report["batch"].as_i64().unwrap().to_string();
    let waited = env.run(&["wait", &batch]).expect_code(1);
    assert!(
        waited.stderr.contains("with 1 dead and 2 cancelled jobs"),
        "{}",
        waited.stderr
    );

    // A dead job of a batch stays dead (the order barrier); dead retry says why.
    let retried = env.run(&["dead", "retry", &id]).expect_code(1);
    assert!(
        retried
            .stdout
            .contains("0 dead job(s) of queue \"default\" are ready again"),
        "{}",
        retried.stdout
    );
    assert!(
        retried.stderr.contains(&format!(
            "job {id} is in batch {batch}: dead jobs of a batch stay dead"
        )),
        "{}",
        retried.stderr
    );
    assert_eq!(env.count("default", "dead"), 1);
}

#[test]
fn a_job_past_its_timeout_is_killed_and_ends_dead() {
    let env = Env::new();
    let plan = env.path("slow.toml");
    std::fs::write(
        &plan,
        "[[job]]\nname = \"slow\"\ncommand = \"echo begun; sleep 30\"\ntimeout = \"300ms\"\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (run, report) = env.run_plan(&plan, &[]);
    let run = run.expect_code(1);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let slow = job(&report, "slow");
    assert_eq!(slow["state"], "dead");
    let error = slow["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("timed out after 300 ms; process group killed\n"),
        "{error}"
    );
    assert!(error.ends_with("begun\n"), "{error}");
    assert!(
        run.stdout.contains("dead: timed out after 300 ms"),
        "{}",
        run.stdout
    );
}

#[test]
fn failed_output_is_kept_bounded_to_its_last_64_kib() {
    let env = Env::new();
    let plan = env.path("loud.toml");
    std::fs::write(
        &plan,
        "[[job]]\nname = \"loud\"\ncommand = \"head -c 200000 /dev/zero | tr '\\\\0' a; echo LAST; exit 1\"\n",
    )
    .unwrap();
    let (run, report) = env.run_plan(&plan, &[]);
    run.expect_code(1);
    let error = job(&report, "loud")["last_error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.len() <= 64 * 1024, "{} bytes", error.len());
    assert!(error.len() > 60 * 1024, "{} bytes", error.len());
    assert!(
        error.starts_with("exit status 1\n--- output (last part;"),
        "{}",
        &error[..80]
    );
    assert!(error.ends_with("aaaLAST\n"));
}

#[test]
fn the_in_memory_backend_runs_a_plan() {
    let env = Env::new();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relayq"))
        .current_dir(env.dir.path())
        .args(["--db", "memory://", "run"])
        .arg(example("plan.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(": 13 succeeded, 0 dead, 0 cancelled"),
        "{stdout}"
    );
    // Nothing was written to the folder: no relayq.db appeared.
    assert!(!env.path("relayq.db").exists());
}

/// A plan of one command that writes its pid, then sleeps for a minute.
fn sleeper(env: &Env) -> (std::path::PathBuf, std::path::PathBuf) {
    let pidfile = env.path("pid");
    let plan = env.path("sleeper.toml");
    std::fs::write(
        &plan,
        format!(
            "[[job]]\nname = \"sleeper\"\ncommand = \"echo $$ > {}; exec sleep 60\"\n[[job]]\nname = \"after\"\nstage = 1\ncommand = \"true\"\n",
            pidfile.display()
        ),
    )
    .unwrap();
    (plan, pidfile)
}

/// Whether process `pid` has ended (gone, or a zombie).
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_run_past_its_timeout_cancels_the_rest_and_exits_124() {
    let env = Env::new();
    let (plan, pidfile) = sleeper(&env);
    let begun = std::time::Instant::now();
    let (run, report) = env.run_plan(&plan, &["--timeout", "1s"]);
    let run = run.expect_code(124);
    assert!(
        begun.elapsed() < Duration::from_secs(30),
        "{:?}",
        begun.elapsed()
    );
    assert!(
        run.stdout
            .contains("timed out after 1 s: cancelling the batch"),
        "{}",
        run.stdout
    );
    assert_eq!(job(&report, "sleeper")["state"], "cancelled");
    assert_eq!(job(&report, "after")["state"], "cancelled");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    common::eventually("the command to be killed", Duration::from_secs(5), || {
        ended(pid).then_some(())
    });
}

#[test]
fn ctrl_c_cancels_the_batch_kills_the_commands_and_exits_130() {
    let env = Env::new();
    let (plan, pidfile) = sleeper(&env);
    let mut child = env.spawn(&["run", plan.to_str().unwrap()]);
    let pid: i32 = common::eventually("the command to start", Duration::from_secs(20), || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    });
    let run_pid = i32::try_from(child.id()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run_pid),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = common::eventually("relayq run to exit", Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(130), "{stdout}");
    assert!(
        stdout.contains("interrupted: cancelling the batch"),
        "{stdout}"
    );
    assert!(
        stdout.contains(": 0 succeeded, 0 dead, 2 cancelled"),
        "{stdout}"
    );
    assert_eq!(env.count("default", "cancelled"), 2);
    common::eventually("the command to be killed", Duration::from_secs(5), || {
        ended(pid).then_some(())
    });
}

/// A plan of more than 50 jobs ends with totals per stage and the failures first, not a
/// row per job; `--full` prints every row; the JSON report always holds every job.
#[test]
fn a_big_run_prints_failures_first_and_totals() {
    let env = Env::new();
    let mut plan = String::new();
    for i in 0..60 {
        let command = if i == 42 {
            "echo broke-42 >&2; exit 3"
        } else {
            "true"
        };
        plan.push_str(&format!(
            "[[job]]\nname = \"j{i}\"\nstage = {}\ncommand = \"{command}\"\n\n",
            i / 30
        ));
    }
    let path = env.path("big.toml");
    std::fs::write(&path, &plan).unwrap();
    let (run, report) = env.run_plan(&path, &["--workers", "8"]);
    let run = run.expect_code(1);
    // What follows the progress lines (each starts with its time, `[  0.003s]`).
    let summary = |text: &str| -> String {
        text.lines()
            .skip_while(|l| !l.starts_with('['))
            .skip_while(|l| l.starts_with('['))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let out = &summary(&run.stdout);
    assert_eq!(
        report["jobs"].as_array().map(Vec::len),
        Some(60),
        "the JSON report"
    );
    assert!(out.contains("jobs that did not succeed (1)"), "{out}");
    assert!(out.contains("broke-42"), "the failed job's output: {out}");
    assert!(out.contains("60 jobs"), "{out}");
    assert!(out.contains("--full"), "{out}");
    // No row per succeeded job, and no timeline.
    assert!(
        !out.contains("j17"),
        "a succeeded job's row is shown:\n{out}"
    );
    assert!(!out.contains("timeline:"), "{out}");
    let failed = out.find("jobs that did not succeed").unwrap();
    let totals = out.find("60 jobs").unwrap();
    assert!(failed < totals, "failures come before the totals:\n{out}");

    let full = env.run(&["run", path.to_str().unwrap(), "--full", "-q", "big-full"]);
    let full = summary(&full.expect_code(1).stdout);
    assert!(full.contains("j17") && full.contains("timeline:"), "{full}");
}

/// SPEC D: the graph example runs each job after the jobs it names, and no earlier;
/// jobs the graph does not order overlap; the summary shows the edges.
#[test]
fn the_graph_plan_runs_each_job_after_the_jobs_it_names() {
    let env = Env::new();
    let (run, report) = env.run_plan(&example("graph-plan.toml"), &["--workers", "8"]);
    let run = run.expect_code(0);
    let jobs = jobs(&report);
    assert_eq!(jobs.len(), 8);
    let by_name = |name: &str| {
        jobs.iter()
            .find(|j| j["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {report}"))
    };
    let start = |name: &str| time(&by_name(name)["attempts"][0]["started_at"]);
    let end = |name: &str| time(&by_name(name)["finished_at"]);
    for j in jobs {
        assert_eq!(j["state"], "succeeded", "{j}");
        let after: Vec<i64> = j["after"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        for parent in jobs
            .iter()
            .filter(|p| after.contains(&p["id"].as_i64().unwrap()))
        {
            let name = j["name"].as_str().unwrap();
            let p = parent["name"].as_str().unwrap();
            assert!(start(name) >= end(p), "{name} started before {p} ended");
        }
    }
    assert_eq!(
        by_name("load-orders")["after"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    // extract-products is the shortest: its load starts while extract-orders runs.
    assert!(
        start("load-products") < end("extract-orders"),
        "the graph, not the stage, held load-products back"
    );
    // The group keeps the two loads apart.
    let (a, b) = (
        ("load-orders", "load-products"),
        ("load-products", "load-orders"),
    );
    assert!(
        end(a.0) <= start(a.1) || end(b.0) <= start(b.1),
        "the warehouse loads overlapped"
    );
    assert!(
        start("report") >= end("audit"),
        "stage 200 waits for all of stage 100"
    );
    assert!(
        run.stdout
            .contains("after extract-orders, extract-customers"),
        "the timeline shows the edges:\n{}",
        run.stdout
    );
    // `job` lists the jobs it ran after.
    let load = by_name("load-orders")["id"].as_i64().unwrap().to_string();
    let shown = env.run(&["job", &load]).expect_code(0);
    let ids: Vec<String> = ["extract-orders", "extract-customers"]
        .iter()
        .map(|n| format!("job {}", by_name(n)["id"]))
        .collect();
    assert!(
        shown
            .stdout
            .contains(&format!("after:    {}", ids.join(", "))),
        "{}",
        shown.stdout
    );
    // `wait --job` returns at once for a finished job, with its outcome.
    let id = by_name("summary")["id"].as_i64().unwrap().to_string();
    let waited = env
        .run(&["wait", "--job", &id, "--timeout", "5s"])
        .expect_code(0);
    assert!(
        waited.stdout.contains(&format!("job {id} succeeded")),
        "{}",
        waited.stdout
    );
}

/// SPEC D5: a plan with a cycle, an unknown name or a parent of a higher stage is
/// refused before anything is stored, naming the job and the field.
#[test]
fn a_bad_graph_is_refused_naming_the_job() {
    let env = Env::new();
    let cases = [
        (
            "name = \"c\"\n[[job]]\nname = \"a\"\ncommand = \"true\"\nafter = [\"b\"]\n\
             [[job]]\nname = \"b\"\ncommand = \"true\"\nafter = [\"a\"]\n",
            "a cycle: job 1 (\"a\") runs after job 2 (\"b\") runs after job 1 (\"a\")",
        ),
        (
            "[[job]]\nname = \"a\"\ncommand = \"true\"\nafter = [\"nope\"]\n",
            "job 1 (\"a\"): field \"after\": no job is named \"nope\"",
        ),
        (
            "[[job]]\nname = \"a\"\nstage = 2\ncommand = \"true\"\n\
             [[job]]\nname = \"b\"\ncommand = \"true\"\nafter = [\"a\"]\n",
            "job 2 (\"b\"): field \"after\": job 1 (\"a\") is in stage 2, above this job's stage 0",
        ),
    ];
    for (i, (text, says)) in cases.into_iter().enumerate() {
        let path = env.path(&format!("bad-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = env.run(&["run", path.to_str().unwrap()]).expect_code(2);
        assert!(out.stderr.contains(says), "{says}\n{}", out.stderr);
    }
    // Refused before the database was even opened.
    assert!(!env.path("relayq.db").exists(), "nothing stored");
}
