//! Counts per state with every state present, zeros included, for `--json` output: a
//! script reading `counts.dead` should find 0, not a missing key.

use relayq_core::{JobState, QueueStats};
use serde::{Serialize, Serializer, ser::SerializeMap};

/// A count for each of [`JobState::ALL`], serialized as a map in that order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; JobState::ALL.len()]);

impl Counts {
    /// The counts of a queue.
    pub fn of(stats: &QueueStats) -> Self {
        Self(JobState::ALL.map(|s| stats.count(s)))
    }

    /// The count of `state`.
    pub fn get(&self, state: JobState) -> u64 {
        JobState::ALL
            .iter()
            .position(|&s| s == state)
            .map_or(0, |i| self.0[i])
    }
}

impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (state, n) in JobState::ALL.iter().zip(self.0) {
            map.serialize_entry(&state.to_string(), &n)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_present_with_zeros() {
        let mut stats = QueueStats::default();
        stats.counts.insert(JobState::Dead, 1);
        let c = Counts::of(&stats);
        let json = serde_json::to_value(c).unwrap();
        let map = json.as_object().unwrap();
        assert_eq!(map.len(), JobState::ALL.len());
        assert_eq!(map["dead"], 1);
        assert_eq!(map["succeeded"], 0);
        assert_eq!(c.get(JobState::Dead), 1);
    }
}
