//! Progress a command reports: lines `relayq-progress PERCENT [MESSAGE]` written to the
//! file descriptor [`FD`], named to the command by the environment variable [`ENV`]
//! (SPEC L7). Other lines there are ignored, so are lines longer than [`MAX_LINE`]
//! bytes; the descriptor is always drained, so a command never blocks on it.

use relayq_core::progress::MAX_PROGRESS_MESSAGE;

/// The command's descriptor for progress lines.
pub const FD: i32 = 3;

/// The environment variable naming [`FD`] to the command.
pub const ENV: &str = "RELAYQ_PROGRESS_FD";

/// What starts a progress line.
pub const WORD: &str = "relayq-progress";

/// Longest line read as progress; longer ones are skipped to their end.
pub const MAX_LINE: usize = 1024;

/// Splits what the command writes into progress reports, keeping at most one partial
/// line of at most [`MAX_LINE`] bytes between reads.
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
    /// Set while skipping the rest of a line that grew past [`MAX_LINE`].
    skipping: bool,
}

impl Lines {
    /// Feeds `bytes` read from the descriptor; returns the reports of the lines they
    /// complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(u8, String)> {
        let mut out = Vec::new();
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let ends = piece.last() == Some(&b'\n');
            let piece = piece.strip_suffix(b"\n").unwrap_or(piece);
            if !self.skipping {
                self.partial.extend_from_slice(piece);
                if self.partial.len() > MAX_LINE {
                    self.partial.clear();
                    self.skipping = true;
                }
            }
            if ends {
                if !self.skipping {
                    out.extend(parse(&String::from_utf8_lossy(&self.partial)));
                }
                self.partial.clear();
                self.skipping = false;
            }
        }
        out
    }
}

/// `relayq-progress PERCENT [MESSAGE]` as a report: the percent a whole number of at most
/// 100, the message cut to what a report holds; `None` for any other line.
pub fn parse(line: &str) -> Option<(u8, String)> {
    let rest = line.trim_end_matches('\r').strip_prefix(WORD)?;
    let rest = rest.strip_prefix(' ')?.trim_start();
    let (percent, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let percent: u8 = percent.parse().ok().filter(|p| *p <= 100)?;
    let message = message.trim().replace(char::is_control, " ");
    let mut end = message.len().min(MAX_PROGRESS_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Some((percent, message[..end].to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_progress_lines_and_ignores_the_rest() {
        assert_eq!(
            parse("relayq-progress 40 copying table x"),
            Some((40, "copying table x".into()))
        );
        assert_eq!(parse("relayq-progress 100"), Some((100, String::new())));
        assert_eq!(
            parse("relayq-progress  7  a\tb \r"),
            Some((7, "a b".into()))
        );
        for other in [
            "relayq-progress 101 too far",
            "relayq-progress -1",
            "relayq-progress x",
            "relayq-progress",
            "relayq-progress40",
            "progress 40",
            "",
        ] {
            assert_eq!(parse(other), None, "{other:?}");
        }
        let long = format!("relayq-progress 5 {}", "é".repeat(200));
        let (_, message) = parse(&long).unwrap();
        assert!(message.len() <= MAX_PROGRESS_MESSAGE && message.starts_with('é'));
    }

    #[test]
    fn splits_lines_across_reads_and_skips_long_ones() {
        let mut lines = Lines::default();
        assert_eq!(lines.push(b"relayq-progress 1"), vec![]);
        assert_eq!(
            lines.push(b"0 a\nnoise\nrelayq-progress 20 b\nrelayq-pro"),
            vec![(10, "a".into()), (20, "b".into())]
        );
        assert_eq!(lines.push(b"gress 30\n"), vec![(30, String::new())]);
        let long = format!("relayq-progress 50 {}", "x".repeat(MAX_LINE));
        assert_eq!(lines.push(long.as_bytes()), vec![]);
        assert_eq!(
            lines.push(b"still the long line\nrelayq-progress 60\n"),
            vec![(60, String::new())]
        );
    }
}
