//! The job payload: a shell command and how to run it, stored as JSON.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

/// What a worker runs for one job: `sh -c COMMAND` with these settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    /// The shell command line, run by `sh -c`.
    pub command: String,
    /// A display name (plans); absent for jobs enqueued without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Extra environment variables, on top of the worker's own environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory; the worker's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Kill the command (its whole process group) after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl CommandSpec {
    /// A spec running `command` with every other setting at its default.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            name: None,
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: None,
        }
    }

    /// The per-job timeout, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    /// The JSON payload.
    pub fn to_payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a CommandSpec always serializes")
    }

    /// Reads a payload written by [`to_payload`](Self::to_payload).
    pub fn from_payload(payload: &[u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(payload)
    }

    /// What to show for the job: its name, else its command on one line, shortened.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| shorten(&self.command, 40))
    }
}

/// `text` on one line, cut to at most `max` characters (with an ellipsis).
pub fn shorten(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The display name of a stored payload, or a placeholder when it is not a command.
pub fn payload_name(payload: &[u8]) -> String {
    CommandSpec::from_payload(payload).map_or_else(
        |_| "(not a relayq command)".to_owned(),
        |s| s.display_name(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        let mut spec = CommandSpec::new("echo hi");
        spec.env.insert("A".into(), "b".into());
        spec.timeout_ms = Some(1500);
        let back = CommandSpec::from_payload(&spec.to_payload()).unwrap();
        assert_eq!(back, spec);
        assert_eq!(back.timeout(), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn display_name_falls_back_to_the_shortened_command() {
        let spec =
            CommandSpec::new("sleep 1 &&\n   echo a-very-long-command-line-that-goes-on-and-on");
        let name = spec.display_name();
        assert_eq!(name.chars().count(), 40);
        assert!(name.starts_with("sleep 1 && echo"));
        assert!(name.ends_with('…'));
    }
}
