//! The small subcommands; `run` has its own modules.

pub mod batch;
pub mod cancel;
pub mod dead;
pub mod enqueue;
pub mod job;
pub mod metrics;
pub mod prune;
pub mod queue;
pub mod status;
pub mod wait;
pub mod work;

use chrono::{DateTime, SecondsFormat, Utc};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

/// A table with the look every command uses.
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(header);
    t
}

/// A time as RFC 3339 UTC with milliseconds.
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
