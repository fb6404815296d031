//! Exit codes, and which errors map to which.

use std::{fmt, process::ExitCode};

use relayq_core::Error as CoreError;

use crate::plan::PlanError;

/// Everything went as asked.
pub const OK: u8 = 0;
/// Jobs ended dead or cancelled, or the command failed (backend down, ...).
pub const FAILED: u8 = 1;
/// Bad input: arguments, plan, database URL, unknown job or batch. Nothing was stored.
/// (clap uses 2 for its own usage errors too.)
pub const INVALID: u8 = 2;
/// A `--timeout` passed before what was waited for happened (as `timeout(1)` does).
pub const TIMEOUT: u8 = 124;
/// The run was interrupted by Ctrl-C (128 + SIGINT).
pub const INTERRUPTED: u8 = 130;

/// Bad input found by the CLI itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// An error for bad input, exiting with [`INVALID`].
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    Usage(msg.into()).into()
}

/// The exit code for an error that ended a command.
pub fn code_for(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<PlanError>() || cause.is::<Usage>() {
            return INVALID;
        }
        if let Some(core) = cause.downcast_ref::<CoreError>() {
            return match core {
                CoreError::InvalidInput { .. }
                | CoreError::NotFound { .. }
                | CoreError::StageClosed { .. } => INVALID,
                CoreError::Timeout { .. } => TIMEOUT,
                _ => FAILED,
            };
        }
    }
    FAILED
}

/// `e` with its causes, each said once: errors that print their source in their own
/// message (the core's `backend error: ...` does) would otherwise repeat it.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if last.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

/// `code` as a process exit code.
pub fn exit(code: u8) -> ExitCode {
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_its_message_is_said_once() {
        let inner = CoreError::backend("connection refused");
        let e = anyhow::Error::new(inner).context("cannot open \"postgres://x\"");
        assert_eq!(
            describe(&e),
            "cannot open \"postgres://x\": backend error: connection refused"
        );
    }

    #[test]
    fn errors_map_to_codes_through_context() {
        let e = anyhow::Error::new(CoreError::invalid("group", "bad")).context("enqueue");
        assert_eq!(code_for(&e), INVALID);
        let e = anyhow::Error::new(CoreError::Timeout { what: "x".into() }).context("wait");
        assert_eq!(code_for(&e), TIMEOUT);
        assert_eq!(code_for(&usage("no")), INVALID);
        assert_eq!(code_for(&PlanError("p".into()).into()), INVALID);
        assert_eq!(code_for(&anyhow::anyhow!("disk on fire")), FAILED);
        assert_eq!(code_for(&CoreError::backend("down").into()), FAILED);
    }
}
