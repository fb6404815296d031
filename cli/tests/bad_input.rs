//! Bad plans and bad arguments: clear errors naming the place and field, exit code 2,
//! and nothing stored.

mod common;

use common::Env;

/// Runs `text` as a plan in queue `bad`; returns the error output after checking the
/// exit code and that queue `bad` holds no job.
fn rejected(env: &Env, file: &str, text: &str) -> String {
    std::fs::write(env.path(file), text).unwrap();
    let out = env.run(&["run", file, "--queue", "bad"]).expect_code(2);
    assert!(
        out.stdout.is_empty(),
        "printed as if it ran:\n{}",
        out.stdout
    );
    // The database may not even exist: a bad plan is rejected before it is opened.
    if env.path("relayq.db").exists() {
        assert_eq!(env.status("bad")["stats"]["total"], 0);
    }
    out.stderr
}

#[test]
fn a_toml_syntax_error_names_file_line_and_column() {
    let env = Env::new();
    let err = rejected(
        &env,
        "broken.toml",
        "[[job]]\ncommand = \"true\"\nstage = = 3\n",
    );
    assert!(err.starts_with("relayq: error: broken.toml:3:9: "), "{err}");
    assert!(err.contains("3 | stage = = 3"), "{err}");
}

#[test]
fn a_bad_field_names_job_index_name_and_field() {
    let env = Env::new();
    let err = rejected(
        &env,
        "plan.toml",
        "[[job]]\ncommand = \"true\"\n[[job]]\ncommand = \"true\"\n[[job]]\nname = \"load\"\ncommand = \"true\"\ntimeout = \"3x\"\n",
    );
    assert!(
        err.contains(r#"plan.toml:8:11: job 3 ("load"): field "timeout": invalid duration "3x""#),
        "{err}"
    );
}

#[test]
fn core_rules_reject_a_bad_group_before_anything_is_stored() {
    let env = Env::new();
    // A valid plan first, so the database exists and holds jobs of another queue.
    let good = "[[job]]\ncommand = \"true\"\n";
    std::fs::write(env.path("good.toml"), good).unwrap();
    env.run(&["run", "good.toml"]).expect_code(0);
    // Job 1 is fine; job 2's group has a control character (a TOML "\t").
    let err = rejected(
        &env,
        "group.toml",
        "[[job]]\ncommand = \"true\"\n[[job]]\nname = \"m\"\ncommand = \"true\"\ngroup = \"a\\tb\"\n",
    );
    assert!(
        err.contains(
            r#"group.toml: job 2 ("m"): field "group": must not contain control characters"#
        ),
        "{err}"
    );
    assert_eq!(env.status("default")["stats"]["counts"]["succeeded"], 1);
    assert_eq!(env.status("bad")["stats"]["total"], 0);
}

#[test]
fn an_invalid_last_job_stores_none_of_the_valid_ones() {
    let env = Env::new();
    env.run(&["enqueue", "--queue", "bad", "--", "true"])
        .expect_code(0);
    std::fs::write(
        env.path("p.toml"),
        "[[job]]\ncommand = \"true\"\n[[job]]\ncommand = \"true\"\n[[job]]\ncommand = \"true\"\nmax_attempts = 0\n",
    )
    .unwrap();
    let out = env.run(&["run", "p.toml", "--queue", "bad"]).expect_code(2);
    assert!(
        out.stderr
            .contains(r#"job 3: field "max_attempts": must be 1..=1000, got 0"#),
        "{}",
        out.stderr
    );
    // Only the job enqueued before is there.
    let stats = &env.status("bad")["stats"];
    assert_eq!(
        (stats["total"].as_u64(), stats["counts"]["ready"].as_u64()),
        (Some(1), Some(1))
    );
}

#[test]
fn a_missing_plan_file_is_a_clear_error() {
    let env = Env::new();
    let out = env.run(&["run", "nope.toml"]).expect_code(2);
    assert!(
        out.stderr.contains("nope.toml: cannot read the plan:"),
        "{}",
        out.stderr
    );
}

#[test]
fn database_urls_of_other_backends_and_unknown_schemes_are_clear_errors() {
    let env = Env::new();
    let plan = env.path("p.toml");
    std::fs::write(&plan, "[[job]]\ncommand = \"true\"\n").unwrap();
    // A SQL Server nobody listens for: the backend is built in, and says why it
    // cannot connect (exit 1); an unknown scheme is a usage error (exit 2).
    for (url, code, says) in [
        ("mssql://sa:s3cretpw@127.0.0.1:1/master", 1, "refused"),
        ("ftp://x", 2, "unknown scheme ftp://"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relayq"))
            .current_dir(env.dir.path())
            .args(["--db", url, "run"])
            .arg(&plan)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{url}: {stderr}");
        assert!(stderr.contains(says), "{url}: {stderr}");
        assert!(!stderr.contains("s3cretpw"), "{url}: {stderr}");
    }
}

#[test]
fn enqueue_names_the_flag_of_a_bad_value() {
    let env = Env::new();
    let out = env
        .run(&["enqueue", "--max-attempts", "0", "--", "true"])
        .expect_code(2);
    assert!(
        out.stderr
            .contains("--max-attempts: must be 1..=1000, got 0"),
        "{}",
        out.stderr
    );
    let out = env
        .run(&["enqueue", "--queue", "no spaces", "--", "true"])
        .expect_code(2);
    assert!(
        out.stderr.contains("--queue: may hold only"),
        "{}",
        out.stderr
    );
    let out = env
        .run(&["enqueue", "--stage", "3", "--", "true"])
        .expect_code(2);
    assert!(out.stderr.contains("--batch"), "{}", out.stderr);
    // None of these stored anything (nor created the database).
    assert!(!env.path("relayq.db").exists());
}

#[test]
fn read_commands_do_not_create_a_database() {
    let env = Env::new();
    let out = env.run(&["status"]).expect_code(2);
    assert!(out.stderr.contains("no database at"), "{}", out.stderr);
    assert!(!env.path("relayq.db").exists());
}

#[test]
fn a_missing_cwd_is_found_before_anything_is_stored() {
    let env = Env::new();
    let err = rejected(
        &env,
        "cwd.toml",
        "[[job]]\ncommand = \"true\"\n\n[[job]]\nname = \"load\"\ncommand = \"true\"\ncwd = \"no-such-folder\"\n",
    );
    let folder = env.path("no-such-folder");
    assert!(
        err.contains("job 2 (\"load\"): field \"cwd\"")
            && err.contains(&folder.display().to_string()),
        "{err}"
    );
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(
        err.contains("cwd.toml:7:"),
        "the error should name the line: {err}"
    );
}

#[test]
fn enqueue_without_the_separator_suggests_it() {
    let env = Env::new();
    let out = env.run(&["enqueue", "ls", "-la"]).expect_code(2);
    assert!(out.stderr.contains("-- "), "{}", out.stderr);
    assert!(!env.path("relayq.db").exists());
}

#[test]
fn every_help_lists_every_scheme_of_the_binary() {
    let env = Env::new();
    for cmd in [
        &["--help"][..],
        &["status", "--help"],
        &["work", "--help"],
        &["run", "--help"],
    ] {
        let out = env.run(cmd).expect_code(0).stdout;
        for scheme in [
            "sqlite://",
            "postgres://",
            "redis://",
            "redis-cluster://",
            "mssql://",
            "memory://",
        ] {
            assert!(
                out.contains(scheme),
                "{cmd:?} does not list {scheme}:\n{out}"
            );
        }
    }
}

#[test]
fn a_sqlite_file_that_cannot_open_names_the_path_and_the_reason_once() {
    let env = Env::new();
    let path = env.path("no/such/folder/q.db");
    let db = format!("sqlite://{}", path.display());
    let started = std::time::Instant::now();
    let out = Env::with_db(&db).run(&["enqueue", "--", "true"]);
    let took = started.elapsed();
    let err = out.stderr;
    assert_eq!(out.code, 1, "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "said more than once: {err}"
    );
    assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
}
