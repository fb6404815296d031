use std::path::Path;

use super::*;

fn parse_str(text: &str) -> Result<Plan, PlanError> {
    parse("plan.toml", text, Path::new("/base"))
}

fn err(text: &str) -> String {
    parse_str(text).unwrap_err().0
}

#[test]
fn a_full_plan_parses_with_defaults_filled_in() {
    let plan = parse_str(
        r#"
on_failure = "halt"

[[job]]
name = "extract-a"
command = "sleep 0.2 && echo a"
stage = 100
group = "db"
priority = -2
max_attempts = 4
timeout = "1m 30s"
env = { KEY = "v" }
cwd = "some/dir"

[[job]]
command = "true"
"#,
    )
    .unwrap();
    assert_eq!(plan.on_failure, OnFailure::Halt);
    let [a, b] = &plan.jobs[..] else {
        panic!("two jobs expected, got {:?}", plan.jobs)
    };
    assert_eq!(a.spec.name.as_deref(), Some("extract-a"));
    assert_eq!(a.spec.command, "sleep 0.2 && echo a");
    assert_eq!((a.stage, a.priority, a.max_attempts), (100, -2, 4));
    assert_eq!(a.group.as_deref(), Some("db"));
    assert_eq!(a.spec.timeout_ms, Some(90_000));
    assert_eq!(a.spec.env.get("KEY").map(String::as_str), Some("v"));
    assert_eq!(a.spec.cwd.as_deref(), Some("/base/some/dir"));
    assert_eq!(b.index, 2);
    assert_eq!((b.stage, b.priority), (0, 0));
    assert_eq!(b.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(b.spec.timeout_ms, None);
    assert_eq!(plan.stages(), vec![(0, 1), (100, 1)]);
}

#[test]
fn on_failure_defaults_to_continue() {
    let plan = parse_str("[[job]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(plan.on_failure, OnFailure::Continue);
}

#[test]
fn the_batch_is_named_by_the_plan_or_its_file() {
    let plan = parse_str("name = \"nightly load\"\n[[job]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(plan.name, "nightly load");
    let plan = parse(
        "dir/etl.toml",
        "[[job]]\ncommand = \"true\"\n",
        Path::new("/"),
    )
    .unwrap();
    assert_eq!(plan.name, "etl");
    assert_eq!(
        err("name = \"\"\n[[job]]\ncommand = \"true\"\n"),
        "plan.toml:1:8: field \"name\": must be 1 to 255 bytes, got 0"
    );
}

#[test]
fn toml_syntax_errors_give_line_and_column() {
    let e = err("[[job]]\ncommand = \"true\"\nstage = = 3\n");
    assert!(
        e.starts_with("plan.toml:3:9: job 1: field \"stage\": "),
        "{e}"
    );
    assert!(e.contains("3 | stage = = 3"), "{e}");
}

#[test]
fn unknown_fields_are_rejected_with_their_location() {
    let e = err("[[job]]\ncomand = \"true\"\n");
    assert!(
        e.starts_with("plan.toml:2:1: job 1: field \"comand\": "),
        "{e}"
    );
    assert!(e.contains("unknown field `comand`"), "{e}");
}

#[test]
fn type_errors_name_job_field_and_place() {
    let e = err("[[job]]\ncommand = \"true\"\n[[job]]\ncommand = \"true\"\npriority = \"high\"\n");
    assert!(
        e.starts_with(r#"plan.toml:5:12: job 2: field "priority": invalid type: string "high", expected an integer"#),
        "{e}"
    );
}

#[test]
fn a_bad_timeout_names_job_name_field_and_value() {
    let e = err(r#"
[[job]]
command = "true"

[[job]]
command = "true"

[[job]]
name = "load"
command = "true"
timeout = "3x"
"#);
    assert!(
        e.starts_with(r#"plan.toml:11:11: job 3 ("load"): field "timeout": invalid duration "3x""#),
        "{e}"
    );
}

#[test]
fn a_zero_timeout_is_rejected() {
    let e = err("[[job]]\ncommand = \"true\"\ntimeout = \"0s\"\n");
    assert!(
        e.contains(r#"job 1: field "timeout": invalid duration "0s": must be above zero"#),
        "{e}"
    );
}

#[test]
fn a_missing_command_names_the_job() {
    let e = err("[[job]]\ncommand = \"true\"\n[[job]]\nname = \"x\"\n");
    assert!(
        e.starts_with(r#"plan.toml:3:1: job 2 ("x"): field "command": missing"#),
        "{e}"
    );
}

#[test]
fn an_empty_command_is_rejected() {
    let e = err("[[job]]\ncommand = \"  \"\n");
    assert!(e.contains(r#"job 1: field "command": is empty"#), "{e}");
}

#[test]
fn numbers_out_of_range_name_their_field() {
    let e = err("[[job]]\ncommand = \"true\"\npriority = 40000\n");
    assert!(
        e.contains(r#"plan.toml:3:12: job 1: field "priority": 40000 is out of range"#),
        "{e}"
    );
    let e = err("[[job]]\ncommand = \"true\"\nstage = 3000000000\n");
    assert!(
        e.contains(r#"job 1: field "stage": 3000000000 is out of range"#),
        "{e}"
    );
    // Beyond i64 too, without naming a Rust type.
    let e = err("[[job]]\ncommand = \"true\"\nstage = 99999999999999999999\n");
    assert!(
        e.contains(r#"job 1: field "stage": 99999999999999999999 is out of range"#)
            && !e.contains("i128"),
        "{e}"
    );
    for bad in ["0", "1001", "-1"] {
        let e = err(&format!(
            "[[job]]\ncommand = \"true\"\nmax_attempts = {bad}\n"
        ));
        assert!(
            e.contains(&format!(
                r#"job 1: field "max_attempts": must be 1..=1000, got {bad}"#
            )),
            "{e}"
        );
    }
}

#[test]
fn duplicate_names_are_rejected() {
    let e = err(
        "[[job]]\nname = \"a\"\ncommand = \"true\"\n[[job]]\nname = \"a\"\ncommand = \"true\"\n",
    );
    assert!(
        e.contains(r#"plan.toml:5:8: job 2 ("a"): field "name": "a" is already the name of job 1"#),
        "{e}"
    );
}

#[test]
fn bad_on_failure_and_env_are_rejected() {
    let e = err("on_failure = \"stop\"\n[[job]]\ncommand = \"true\"\n");
    assert!(
        e.starts_with(
            r#"plan.toml:1:14: field "on_failure": expected "continue" or "halt", got "stop""#
        ),
        "{e}"
    );
    let e = err("[[job]]\ncommand = \"true\"\nenv = { \"A=B\" = \"v\" }\n");
    assert!(
        e.contains(r#"job 1: field "env": invalid variable name "A=B""#),
        "{e}"
    );
}

#[test]
fn a_plan_without_jobs_is_rejected() {
    assert_eq!(
        err("on_failure = \"halt\"\n"),
        "plan.toml: the plan has no jobs (add [[job]] tables, each with a `command`)"
    );
}

#[test]
fn core_rules_are_applied_per_job() {
    let plan = parse_str(
        "[[job]]\ncommand = \"true\"\n[[job]]\nname = \"m\"\ncommand = \"true\"\ngroup = \"a\\tb\"\n",
    )
    .unwrap();
    let e = plan.new_jobs("default", BatchId(0)).unwrap_err().0;
    assert!(
        e.starts_with(r#"plan.toml: job 2 ("m"): field "group": "#),
        "{e}"
    );
    let e = plan.new_jobs("bad queue", BatchId(0)).unwrap_err().0;
    assert!(
        e.starts_with(r#"--queue "bad queue": invalid queue"#),
        "{e}"
    );
}

#[test]
fn new_jobs_carry_the_plan_settings() {
    let plan = parse_str(
        "[[job]]\nname = \"a\"\ncommand = \"echo a\"\nstage = 7\ngroup = \"g\"\npriority = 3\nmax_attempts = 2\n",
    )
    .unwrap();
    let jobs = plan.new_jobs("q", BatchId(9)).unwrap();
    let [job] = &jobs[..] else { panic!("{jobs:?}") };
    assert_eq!(job.queue, "q");
    assert_eq!((job.batch, job.stage), (Some(BatchId(9)), Some(7)));
    assert_eq!(job.group.as_deref(), Some("g"));
    assert_eq!((job.priority, job.max_attempts), (3, 2));
    let spec = CommandSpec::from_payload(&job.payload).unwrap();
    assert_eq!(spec.command, "echo a");
    assert_eq!(spec.name.as_deref(), Some("a"));
}

#[test]
fn limit_keys_and_their_limits_come_from_the_plan() {
    let plan = parse_str(
        "each_key_limit = 2\n[key_limits]\n\"db-a\" = 1\n\n[[job]]\ncommand = \"true\"\nlimit_key = \"db-a\"\n",
    )
    .unwrap();
    assert_eq!(plan.key_limits, [(None, 2), (Some("db-a".to_owned()), 1)]);
    let jobs = plan.new_jobs("q", BatchId(1)).unwrap();
    assert_eq!(jobs[0].limit_key.as_deref(), Some("db-a"));
    let e = err("[key_limits]\n\"db-a\" = 0\n[[job]]\ncommand = \"true\"\n");
    assert!(
        e.contains("key_limits") && e.contains("db-a") && e.contains("1 or more"),
        "{e}"
    );
    // Checked with the core's rules, as a group is, before anything is stored.
    let plan = parse_str("[[job]]\ncommand = \"true\"\nlimit_key = \"a\\nb\"\n").unwrap();
    let e = plan.new_jobs("q", BatchId(1)).unwrap_err().to_string();
    assert!(e.contains("field \"limit_key\""), "{e}");
}

#[test]
fn a_queue_rate_comes_from_the_plan() {
    let plan =
        parse_str("rate = \"10/1s\"\nrate_burst = 2\n[[job]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(
        plan.rate,
        Some(relayq_core::Rate::new(10, std::time::Duration::from_secs(1)).with_burst(2))
    );
    for (text, field) in [
        ("rate = \"0/1s\"\n", "rate"),
        ("rate = \"10/0s\"\n", "rate"),
        ("rate = \"10/1s\"\nrate_burst = 11\n", "rate_burst"),
        ("rate_burst = 2\n", "rate_burst"),
        ("rate = \"10/1s\"\nrate_burst = -1\n", "rate_burst"),
    ] {
        let e = err(&format!("{text}[[job]]\ncommand = \"true\"\n"));
        assert!(e.contains(&format!("field \"{field}\"")), "{text}: {e}");
    }
}
