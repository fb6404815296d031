//! A short fault run on SQLite, end to end: the `relayq` binary as worker processes,
//! SIGKILLs, SIGSTOPs past the lease, every worker killed at once, cancels; the run
//! must report no violation. It needs `target/debug/relayq` (`cargo build -p
//! relayq-cli`; `cargo test --workspace` builds it).

use std::process::Command;

#[test]
fn a_short_sqlite_run_has_no_violation() {
    let exe = env!("CARGO_BIN_EXE_relayq-torture");
    let relayq = std::path::Path::new(exe).with_file_name("relayq");
    assert!(
        relayq.exists(),
        "no relayq binary at {}: build it first with `cargo build -p relayq-cli`",
        relayq.display()
    );
    let out = Command::new(exe)
        .args([
            "--short",
            "--backend",
            "sqlite",
            "--seed",
            "11",
            "--jobs",
            "300",
        ])
        .output()
        .expect("relayq-torture runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "relayq-torture failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("== sqlite: no violation"), "{stdout}");
    // Every check ran on something: a check with nothing to look at is not a pass.
    assert!(!stdout.contains("nothing to check"), "{stdout}");
}
