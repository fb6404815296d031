//! A claim's admission under limit keys (SPEC K2, K4, K6), for backends that decide it
//! candidate by candidate in order key: take the job, leave it for now, or park it
//! because its key is full.

use std::collections::HashMap;

/// What a claim does with one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Claim it.
    Take,
    /// Its key is full: it waits until a slot of its key frees (a backend may set it
    /// aside, "park" it, so later claims do not read it again).
    Full,
    /// Leave it for another claim: it would be claimed ahead into its key's last free
    /// slot (SPEC K6), or the claim has all it wants.
    Leave,
}

/// The admission of one claim: how many it took and each key's running count.
#[derive(Debug)]
pub struct KeyAdmission {
    want: u32,
    slots: u32,
    taken: u32,
    running: HashMap<String, u64>,
}

impl KeyAdmission {
    /// A claim of up to `want` jobs, the first `slots` of which start at once.
    #[must_use]
    pub fn new(want: u32, slots: u32) -> Self {
        Self {
            want,
            slots: slots.min(want),
            taken: 0,
            running: HashMap::new(),
        }
    }

    /// Whether the claim already knows `key`'s running count (asked for it before).
    #[must_use]
    pub fn knows(&self, key: &str) -> bool {
        self.running.contains_key(key)
    }

    /// Whether the claim has all it wants.
    #[must_use]
    pub fn done(&self) -> bool {
        self.taken >= self.want
    }

    /// Decides on the next candidate in order key: its key, that key's limit, and
    /// `running`, which gives the key's running count when the claim first meets it
    /// (jobs this claim took are counted on top).
    pub fn decide(
        &mut self,
        key: Option<&str>,
        limit: Option<u32>,
        running: impl FnOnce() -> u64,
    ) -> Admit {
        if self.done() {
            return Admit::Leave;
        }
        let (Some(key), Some(limit)) = (key, limit) else {
            self.taken += 1;
            return Admit::Take;
        };
        let count = self.running.entry(key.to_owned()).or_insert_with(running);
        let limit = u64::from(limit);
        if *count >= limit {
            return Admit::Full;
        }
        // Claimed ahead, it would sit in a buffer on the key's last slot.
        if self.taken >= self.slots && *count + 1 >= limit {
            return Admit::Leave;
        }
        *count += 1;
        self.taken += 1;
        Admit::Take
    }

    /// Decides `candidates` (job id and key, in order key), each key's limit and
    /// running count given by `keys` (a key not there has no limit); returns the ids to
    /// claim and the ids to park. For a backend that reads a batch of candidates and
    /// its keys' counts at once.
    pub fn split(
        &mut self,
        candidates: &[(i64, Option<String>)],
        keys: &HashMap<String, (Option<u32>, u64)>,
    ) -> (Vec<i64>, Vec<i64>) {
        let (mut take, mut park) = (Vec::new(), Vec::new());
        for (id, key) in candidates {
            if self.done() {
                break;
            }
            let (limit, running) = key
                .as_deref()
                .and_then(|k| keys.get(k).copied())
                .unwrap_or((None, 0));
            match self.decide(key.as_deref(), limit, || running) {
                Admit::Take => take.push(*id),
                Admit::Full => park.push(*id),
                Admit::Leave => {}
            }
        }
        (take, park)
    }

    /// Jobs taken so far.
    #[must_use]
    pub fn taken(&self) -> u32 {
        self.taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_key_is_skipped_and_others_fill_the_claim() {
        let mut a = KeyAdmission::new(3, 3);
        assert_eq!(a.decide(Some("k"), Some(1), || 1), Admit::Full);
        assert_eq!(a.decide(Some("k"), Some(1), || unreachable!()), Admit::Full);
        assert_eq!(a.decide(Some("j"), Some(2), || 0), Admit::Take);
        assert_eq!(a.decide(Some("j"), Some(2), || unreachable!()), Admit::Take);
        assert_eq!(a.decide(Some("j"), Some(2), || unreachable!()), Admit::Full);
        assert_eq!(a.decide(None, None, || unreachable!()), Admit::Take);
        assert!(a.done());
        assert_eq!(a.decide(None, None, || 0), Admit::Leave);
    }

    #[test]
    fn a_job_claimed_ahead_never_takes_its_key_s_last_slot() {
        let mut a = KeyAdmission::new(4, 1);
        assert_eq!(a.decide(None, None, || 0), Admit::Take);
        // Ahead now: a key of limit 1 is left, one of 3 with 1 running takes one.
        assert_eq!(a.decide(Some("one"), Some(1), || 0), Admit::Leave);
        assert_eq!(a.decide(Some("three"), Some(3), || 1), Admit::Take);
        assert_eq!(
            a.decide(Some("three"), Some(3), || unreachable!()),
            Admit::Leave
        );
        assert_eq!(a.decide(Some("free"), None, || unreachable!()), Admit::Take);
        assert_eq!(a.taken(), 3);
    }

    #[test]
    fn split_sorts_a_batch_of_candidates() {
        let keys = HashMap::from([("k".to_owned(), (Some(1), 0)), ("u".to_owned(), (None, 9))]);
        let candidates = [
            (1, Some("k".to_owned())),
            (2, Some("k".to_owned())),
            (3, Some("u".to_owned())),
            (4, None),
            (5, None),
        ];
        let mut a = KeyAdmission::new(3, 3);
        assert_eq!(a.split(&candidates, &keys), (vec![1, 3, 4], vec![2]));
    }
}
