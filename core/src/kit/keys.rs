//! A claim's admission under limit keys (SPEC K2, K4, K6) and their rates (SPEC K12,
//! K13), for backends that decide it candidate by candidate in order key: take the
//! job, leave it for now, or park it because its key is full or its key's rate allows
//! no start now.

use std::collections::HashMap;

use crate::kit::rate;
use crate::{Enqueued, NewJob, Rate};

/// SPEC K4: the ids of the jobs an enqueue stored (`out`, in the order of `jobs`) that
/// carry a limit key: the ones a backend that parks at enqueue looks at. A job a dedupe
/// key found already stored is left out: it was not stored now.
#[must_use]
pub fn new_keyed_ids(jobs: &[NewJob], out: &[Enqueued]) -> Vec<i64> {
    jobs.iter()
        .zip(out)
        .filter(|(j, e)| j.limit_key.is_some() && !e.deduplicated)
        .map(|(_, e)| e.id.0)
        .collect()
}

/// What a claim does with one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Claim it.
    Take,
    /// Its key is full: it waits until a slot of its key frees (a backend may set it
    /// aside, "park" it, so later claims do not read it again).
    Full,
    /// Its key's rate allows no start now: it waits until the key's wake time
    /// ([`KeyAdmission::rated`]); a backend may park it until then.
    Paced,
    /// Leave it for another claim: it would be claimed ahead into its key's last free
    /// slot (SPEC K6), or the claim has all it wants.
    Leave,
}

impl Admit {
    /// Whether a backend that parks sets the job aside.
    #[must_use]
    pub fn parks(self) -> bool {
        matches!(self, Self::Full | Self::Paced)
    }
}

/// What a claim knows of one key when it first meets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyInfo {
    /// The limit in force (its own, else the queue's default); `None` for none.
    pub limit: Option<u32>,
    /// Its running jobs, held ahead in buffers included. Only read when it has a limit.
    pub running: u64,
    /// The rate in force (its own, else the queue's default key rate).
    pub rate: Option<Rate>,
    /// The rate's stored value (`kit::rate`), `None` before its first start.
    pub tat: Option<i64>,
}

impl KeyInfo {
    /// A key with a limit and no rate.
    #[must_use]
    pub fn limited(limit: Option<u32>, running: u64) -> Self {
        Self {
            limit,
            running,
            ..Self::default()
        }
    }
}

/// What a claim changed of one key's rate, for the backend to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateChange {
    /// The key.
    pub key: String,
    /// The rate's new value when the claim started jobs of the key.
    pub tat: Option<i64>,
    /// When the key's rate allows its next start, when the claim passed over a job of
    /// the key for its rate: the time to put its parked jobs back.
    pub wake: Option<i64>,
}

#[derive(Debug)]
struct KeyState {
    info: KeyInfo,
    moved: bool,
    wake: Option<i64>,
    full: bool,
}

/// The admission of one claim: how many it took and what it knows of each key.
#[derive(Debug)]
pub struct KeyAdmission {
    want: u32,
    slots: u32,
    taken: u32,
    now: i64,
    keys: HashMap<String, KeyState>,
}

impl KeyAdmission {
    /// A claim of up to `want` jobs, the first `slots` of which start at once.
    #[must_use]
    pub fn new(want: u32, slots: u32) -> Self {
        Self {
            want,
            slots: slots.min(want),
            taken: 0,
            now: 0,
            keys: HashMap::new(),
        }
    }

    /// The claim's time in microseconds on the server's clock, which key rates judge
    /// at (its jobs start then).
    #[must_use]
    pub fn at(mut self, now_us: i64) -> Self {
        self.now = now_us;
        self
    }

    /// Whether the claim already knows `key` (met it before).
    #[must_use]
    pub fn knows(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// Whether the claim has all it wants.
    #[must_use]
    pub fn done(&self) -> bool {
        self.taken >= self.want
    }

    /// Decides on the next candidate in order key, given its key and `info`, which
    /// tells what is known of the key when the claim first meets it (jobs this claim
    /// took, and the starts its rate counted, come on top).
    pub fn decide(&mut self, key: Option<&str>, info: impl FnOnce() -> KeyInfo) -> Admit {
        if self.done() {
            return Admit::Leave;
        }
        let Some(key) = key else {
            self.taken += 1;
            return Admit::Take;
        };
        let state = self.keys.entry(key.to_owned()).or_insert_with(|| KeyState {
            info: info(),
            moved: false,
            wake: None,
            full: false,
        });
        let info = &mut state.info;
        if let Some(limit) = info.limit.map(u64::from) {
            if info.running >= limit {
                state.full = true;
                return Admit::Full;
            }
            // Claimed ahead, it would sit in a buffer on the key's last slot.
            if self.taken >= self.slots && info.running + 1 >= limit {
                return Admit::Leave;
            }
        }
        if let Some(r) = info.rate {
            let a = rate::admit(&r, info.tat, self.now, 1);
            if a.allowed == 0 {
                let wake = rate::next_start(&r, info.tat, self.now).unwrap_or(self.now);
                state.wake = Some(wake);
                return Admit::Paced;
            }
            info.tat = a.tat(1);
            state.moved = true;
        }
        info.running += 1;
        self.taken += 1;
        Admit::Take
    }

    /// Decides `candidates` (job id and key, in order key), each key's state given by
    /// `keys` (a key not there has no limit and no rate); returns the ids to claim and
    /// the ids to park. For a backend that reads a batch of candidates and its keys'
    /// states at once.
    pub fn split(
        &mut self,
        candidates: &[(i64, Option<String>)],
        keys: &HashMap<String, KeyInfo>,
    ) -> (Vec<i64>, Vec<i64>) {
        let (mut take, mut park) = (Vec::new(), Vec::new());
        for (id, key) in candidates {
            if self.done() {
                break;
            }
            let info = || {
                key.as_deref()
                    .and_then(|k| keys.get(k).copied())
                    .unwrap_or_default()
            };
            match self.decide(key.as_deref(), info) {
                Admit::Take => take.push(*id),
                a if a.parks() => park.push(*id),
                _ => {}
            }
        }
        (take, park)
    }

    /// Jobs taken so far.
    #[must_use]
    pub fn taken(&self) -> u32 {
        self.taken
    }

    /// What the claim changed of its keys' rates: each key whose rate it moved on or
    /// that held a job back, in no order.
    #[must_use]
    pub fn rated(&self) -> Vec<RateChange> {
        self.keys
            .iter()
            .filter(|(_, s)| s.moved || s.wake.is_some())
            .map(|(k, s)| RateChange {
                key: k.clone(),
                tat: s.moved.then_some(s.info.tat).flatten(),
                wake: s.wake,
            })
            .collect()
    }

    /// Whether the claim found `key` full (it parked a job of it for its limit): its
    /// parked jobs go back as its slots free, not at a wake time.
    #[must_use]
    pub fn full(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|s| s.full)
    }

    /// For a key whose wake time this claim used (its parked jobs, up to its burst, put
    /// back), when the rest of its parked jobs go back (SPEC K13): when its rate next
    /// allows a start, on the value this claim left (`stored` if it started none), or
    /// now if it allows one now. `None` when the claim found the key full: its jobs go
    /// back as its slots free (a wake time of now would have workers claim in a loop).
    #[must_use]
    pub fn wake_again(&self, key: &str, rate: &Rate, stored: Option<i64>) -> Option<i64> {
        if self.full(key) {
            return None;
        }
        let tat = self
            .keys
            .get(key)
            .filter(|s| s.moved)
            .and_then(|s| s.info.tat)
            .or(stored);
        Some(rate::next_start(rate, tat, self.now).unwrap_or(self.now))
    }

    /// The earliest wake time of a key whose rate held a job back in this claim.
    #[must_use]
    pub fn next_wake(&self) -> Option<i64> {
        self.keys.values().filter_map(|s| s.wake).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Only jobs stored now with a limit key: not those without a key, nor those a
    /// dedupe key found stored before.
    #[test]
    fn new_keyed_ids_are_the_stored_jobs_with_a_key() {
        let jobs = [
            NewJob::new("q", vec![]).limit_key("a"),
            NewJob::new("q", vec![]),
            NewJob::new("q", vec![]).limit_key("b").dedupe_key("d"),
            NewJob::new("q", vec![]).limit_key("a"),
        ];
        let out =
            [(1, false), (2, false), (0, true), (3, false)].map(|(id, deduplicated)| Enqueued {
                id: crate::JobId(id),
                deduplicated,
            });
        assert_eq!(new_keyed_ids(&jobs, &out), [1, 3]);
    }

    fn lim(limit: Option<u32>, running: u64) -> impl FnOnce() -> KeyInfo {
        move || KeyInfo::limited(limit, running)
    }

    fn met() -> KeyInfo {
        unreachable!("a key is asked for once")
    }

    #[test]
    fn a_full_key_is_skipped_and_others_fill_the_claim() {
        let mut a = KeyAdmission::new(3, 3);
        assert_eq!(a.decide(Some("k"), lim(Some(1), 1)), Admit::Full);
        assert_eq!(a.decide(Some("k"), met), Admit::Full);
        assert_eq!(a.decide(Some("j"), lim(Some(2), 0)), Admit::Take);
        assert_eq!(a.decide(Some("j"), met), Admit::Take);
        assert_eq!(a.decide(Some("j"), met), Admit::Full);
        assert_eq!(a.decide(None, met), Admit::Take);
        assert!(a.done());
        assert_eq!(a.decide(None, met), Admit::Leave);
    }

    #[test]
    fn a_job_claimed_ahead_never_takes_its_key_s_last_slot() {
        let mut a = KeyAdmission::new(4, 1);
        assert_eq!(a.decide(None, met), Admit::Take);
        // Ahead now: a key of limit 1 is left, one of 3 with 1 running takes one.
        assert_eq!(a.decide(Some("one"), lim(Some(1), 0)), Admit::Leave);
        assert_eq!(a.decide(Some("three"), lim(Some(3), 1)), Admit::Take);
        assert_eq!(a.decide(Some("three"), met), Admit::Leave);
        assert_eq!(a.decide(Some("free"), lim(None, 0)), Admit::Take);
        assert_eq!(a.taken(), 3);
    }

    #[test]
    fn split_sorts_a_batch_of_candidates() {
        let keys = HashMap::from([
            ("k".to_owned(), KeyInfo::limited(Some(1), 0)),
            ("u".to_owned(), KeyInfo::limited(None, 9)),
        ]);
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

    /// A key's rate takes what it allows, parks the rest until its next start, and
    /// says so; other keys fill the claim.
    #[test]
    fn a_key_s_rate_parks_what_it_does_not_allow() {
        // 11 a second with a burst of 2: one start every 100 ms (`per ÷ (count − burst + 1)`).
        let rate = Rate::new(11, Duration::from_secs(1)).with_burst(2);
        let rated = KeyInfo {
            rate: Some(rate),
            ..KeyInfo::default()
        };
        let keys = HashMap::from([("r".to_owned(), rated)]);
        let candidates: Vec<(i64, Option<String>)> = (1..=4)
            .map(|id| (id, Some("r".to_owned())))
            .chain([(5, Some("free".to_owned()))])
            .collect();
        let now = 5_000_000;
        let mut a = KeyAdmission::new(10, 10).at(now);
        assert_eq!(a.split(&candidates, &keys), (vec![1, 2, 5], vec![3, 4]));
        let changes = a.rated();
        assert_eq!(changes.len(), 1);
        // Two starts at `now` move the value two intervals on; the next start is due
        // one interval after `now`.
        assert_eq!(changes[0].tat, Some(now + 200_000));
        assert_eq!(changes[0].wake, Some(now + 100_000));
        assert_eq!(a.next_wake(), Some(now + 100_000));
        // At the wake time, one more starts.
        let keys = HashMap::from([(
            "r".to_owned(),
            KeyInfo {
                tat: changes[0].tat,
                ..rated
            },
        )]);
        let mut b = KeyAdmission::new(10, 10).at(now + 100_000);
        assert_eq!(b.split(&candidates[2..4], &keys), (vec![3], vec![4]));
    }

    /// SPEC K13: a woken key gets its next wake from the value the claim left, now if
    /// its rate allows a start, and none when the claim found it full.
    #[test]
    fn a_woken_key_wakes_again_unless_full() {
        let rate = Rate::new(11, Duration::from_secs(1)).with_burst(2);
        let now = 5_000_000;
        let rated = KeyInfo {
            rate: Some(rate),
            ..KeyInfo::default()
        };
        let mut a = KeyAdmission::new(10, 10).at(now);
        assert_eq!(a.decide(Some("r"), || rated), Admit::Take);
        assert_eq!(a.wake_again("r", &rate, None), Some(now));
        assert_eq!(a.decide(Some("r"), || unreachable!()), Admit::Take);
        assert_eq!(a.wake_again("r", &rate, None), Some(now + 100_000));
        // A key the claim did not meet: from the stored value.
        assert_eq!(
            a.wake_again("other", &rate, Some(now + 300_000)),
            Some(now + 200_000)
        );
        let full = KeyInfo {
            limit: Some(1),
            running: 1,
            ..rated
        };
        assert_eq!(a.decide(Some("f"), || full), Admit::Full);
        assert_eq!(a.wake_again("f", &rate, None), None);
    }

    /// A key's limit is checked before its rate: a full key's job is not counted as a
    /// start.
    #[test]
    fn a_full_key_does_not_spend_its_rate() {
        let info = KeyInfo {
            limit: Some(1),
            running: 1,
            rate: Some(Rate::new(1, Duration::from_secs(1))),
            tat: None,
        };
        let mut a = KeyAdmission::new(2, 2).at(1);
        assert_eq!(a.decide(Some("k"), || info), Admit::Full);
        assert!(a.rated().is_empty());
    }
}
