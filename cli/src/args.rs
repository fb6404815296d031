//! Arguments shared by several subcommands.

use std::time::Duration;

/// The queue a command works on.
#[derive(Debug, Clone, clap::Args)]
pub struct QueueArg {
    /// The queue (1 to 128 bytes of A-Z a-z 0-9 _ - . :, not dots only).
    #[arg(long, short = 'q', env = "RELAYQ_QUEUE", default_value = "default")]
    pub queue: String,
}

/// Parses a duration such as `500ms`, `30s`, `2m` or `1h 30m` (humantime syntax).
///
/// # Errors
/// A message saying what is expected.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?} ({e}); write e.g. 500ms, 30s, 2m"))
}

/// A duration above zero.
///
/// # Errors
/// See [`duration`]; zero is rejected too.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    let d = duration(text)?;
    if d.is_zero() {
        return Err(format!("invalid duration {text:?}: must be above zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_humantime_syntax() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(
            duration("3x")
                .unwrap_err()
                .contains("invalid duration \"3x\"")
        );
        assert!(positive_duration("0s").unwrap_err().contains("above zero"));
    }
}
