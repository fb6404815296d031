//! The schema relayq lives in: its validated name and the statements written for it.

use relayq_core::{Result, kit::Statements};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "relayq";

/// A validated schema name and this crate's statements, written for it once each
/// (core's [`Statements`]: `{s}` is the bracket-quoted schema, `{n}` its bare name;
/// values are always bound, SPEC X2).
pub(crate) type Schema = Statements;

/// Checks `name` (core's rules: no escaping needed inside `[...]` or `N'...'`).
pub(crate) fn schema(name: &str) -> Result<Schema> {
    Statements::new(name, |n| format!("[{n}]"))
}

#[cfg(test)]
mod tests {
    use relayq_core::Error;

    use super::*;

    #[test]
    fn bad_schema_names_are_refused() {
        // A quote in the name would break the SQL: core's rules refuse it.
        assert!(schema("relayq_2").is_ok());
        assert!(matches!(
            schema("a\"b]c"),
            Err(Error::InvalidInput {
                field: "schema",
                ..
            })
        ));
    }

    #[test]
    fn statements_get_the_quoted_schema() {
        let s = schema("app").unwrap();
        assert_eq!(
            &*s.sql("SELECT 1 FROM {s}.jobs WHERE x = N'{n}'"),
            "SELECT 1 FROM [app].jobs WHERE x = N'app'"
        );
    }
}
