//! Group and dedupe keys as stored.
//!
//! SQL Server's `=` pads the shorter string with spaces before comparing, in every
//! collation, so `'a'` and `'a '` are equal: as group keys they would be one group,
//! as dedupe keys one job. Keys are therefore stored with [`KEY_END`] appended, which
//! no trailing space can follow, and the column's binary collation compares the rest
//! code point by code point.

/// Appended to every stored key.
pub(crate) const KEY_END: char = '#';

/// `key` as stored.
pub(crate) fn store(key: &str) -> String {
    let mut s = String::with_capacity(key.len() + 1);
    s.push_str(key);
    s.push(KEY_END);
    s
}

/// A stored key as given.
pub(crate) fn load(stored: &str) -> String {
    stored.strip_suffix(KEY_END).unwrap_or(stored).to_owned()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn trailing_spaces_stay_significant() {
        assert_ne!(store("a"), store("a "));
        assert!(!store("a ").ends_with(' '));
        assert_eq!(load(&store("a ")), "a ");
        assert_eq!(load(&store("")), "");
        assert_eq!(load(&store("x#")), "x#");
    }

    proptest! {
        #[test]
        fn keys_round_trip(k in ".{0,40}") {
            prop_assert_eq!(load(&store(&k)), k.clone());
            prop_assert!(!store(&k).ends_with(' '));
        }
    }
}
