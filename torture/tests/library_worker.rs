//! The library worker starts each command through `__exec`, which checks the lease's
//! deadline after the fork: a worker frozen before the fork and thawed past its
//! deadline must not start the command.

use std::process::Command;

const WORKER: &str = env!("CARGO_BIN_EXE_relayq-torture-worker");

fn exec(deadline_ns: &str, marker: &std::path::Path) -> std::process::Output {
    Command::new(WORKER)
        .args(["__exec", deadline_ns])
        .arg(format!("touch '{}'", marker.display()))
        .output()
        .expect("the worker binary runs")
}

#[test]
fn a_command_past_its_deadline_is_never_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    // Zero on CLOCK_MONOTONIC is the boot: long past.
    let out = exec("0", &marker);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(!marker.exists(), "the command ran past its deadline");
}

#[test]
fn a_command_before_its_deadline_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = exec(&u128::MAX.to_string(), &marker);
    assert!(out.status.success(), "{out:?}");
    assert!(marker.exists(), "the command did not run");
}

#[test]
fn a_bad_deadline_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = exec("soon", &marker);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("DEADLINE_NS"));
    assert!(!marker.exists());
}
