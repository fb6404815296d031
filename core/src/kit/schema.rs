//! Schema versions, as every backend with a schema compares them: a backend records
//! how many of its migrations ran, and this decides what that means.

use std::ops::Range;

use crate::{Error, Result};

/// Before migrating `schema`, found at version `applied`, to `wanted`: the indexes of
/// the migrations still to run (empty when up to date).
///
/// # Errors
/// [`Error::Schema`] when the schema is newer than this code: a newer relayq wrote it.
pub fn pending(schema: &str, applied: usize, wanted: usize) -> Result<Range<usize>> {
    if applied > wanted {
        return Err(Error::schema(schema, Some(applied), wanted));
    }
    Ok(applied..wanted)
}

/// For a handle that does not migrate: `Ok` when `schema` is at `wanted`.
///
/// # Errors
/// [`Error::Schema`] saying the schema is missing (`found` is `None` or 0), older or
/// newer.
pub fn check(schema: &str, found: Option<usize>, wanted: usize) -> Result<()> {
    if found == Some(wanted) {
        return Ok(());
    }
    Err(Error::schema(schema, found, wanted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, SchemaState};

    fn state(e: &Error) -> SchemaState {
        match e {
            Error::Schema { state, .. } => *state,
            other => panic!("not a schema error: {other}"),
        }
    }

    #[test]
    fn versions_compare_as_documented() {
        assert_eq!(pending("s", 2, 5).unwrap(), 2..5);
        assert!(pending("s", 5, 5).unwrap().is_empty());
        let newer = pending("s", 6, 5).unwrap_err();
        assert_eq!(newer.kind(), ErrorKind::Schema);
        assert_eq!(state(&newer), SchemaState::Newer);

        check("s", Some(5), 5).unwrap();
        assert_eq!(
            state(&check("s", None, 5).unwrap_err()),
            SchemaState::Missing
        );
        assert_eq!(
            state(&check("s", Some(0), 5).unwrap_err()),
            SchemaState::Missing
        );
        assert_eq!(
            state(&check("s", Some(3), 5).unwrap_err()),
            SchemaState::Older
        );
        assert_eq!(
            state(&check("s", Some(7), 5).unwrap_err()),
            SchemaState::Newer
        );
    }
}
