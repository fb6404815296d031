//! Writing to stdout without panicking when it is closed.
//!
//! `println!` panics when stdout is a closed pipe (`relayq status | head -1`). These
//! write through a locked stdout handle and ignore write errors instead: a reader that
//! went away must not abort a run that still has commands to finish and clean up.

/// `println!` that ignores a closed stdout.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` that ignores a closed stdout.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}
