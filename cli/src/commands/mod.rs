//! The small subcommands; `run` has its own modules.

pub mod batch;
pub mod cancel;
pub mod dead;
pub mod enqueue;
pub mod job;
pub mod metrics;
pub mod prune;
pub mod queue;
pub mod run_now;
pub mod schedule;
pub mod status;
pub mod wait;
pub mod why;
pub mod work;

use std::borrow::Cow;

use chrono::{DateTime, SecondsFormat, Utc};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// A table with the look every command uses. On a terminal it fits the terminal's
/// width, wrapping long cells, instead of running past the edge (where the terminal's
/// own wrapping breaks every row in two); piped, it keeps each row on one line.
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    t
}

/// `text` safe to print on a terminal: every control character but line feed and tab
/// is written out (`\u{1b}`, `\r`), so what a job printed cannot move the cursor,
/// recolour or clear the operator's screen.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A time as RFC 3339 UTC with milliseconds.
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A progress report as the tables show it: `40% copying table x`, control characters
/// made visible and URLs' passwords masked.
pub fn progress(p: &relayq_core::Progress) -> String {
    if p.message.is_empty() {
        format!("{}%", p.percent)
    } else {
        let message = relayq_core::redact::urls(&p.message);
        format!("{}% {}", p.percent, printable(&message))
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_written_out() {
        assert_eq!(printable("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(printable("\u{1b}[2Jred\rX\u{7}"), "\\u{1b}[2Jred\\rX\\u{7}");
        assert!(!printable("\u{1b}\u{9b}").chars().any(char::is_control));
    }
}
