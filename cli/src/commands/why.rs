//! `relayq job ID --why`: the rules holding a job back, in words (SPEC M6).

use relayq_core::Why;

use super::printable;

/// One line per reason, with control characters written out (group and worker names
/// are stored text).
pub fn lines(why: &Why) -> Vec<String> {
    why.lines()
        .iter()
        .map(|l| printable(l).into_owned())
        .collect()
}
