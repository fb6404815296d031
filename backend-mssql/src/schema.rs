//! The schema relayq lives in: its validated name and the statements written for it.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
};

use relayq_core::{Error, Result};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "relayq";

/// A validated schema name and this crate's statements, written for it once each.
/// Identifiers cannot be bound as parameters, so the (validated, bracket-quoted) name
/// goes into the text; values are always bound (SPEC X2).
#[derive(Debug)]
pub(crate) struct Schema {
    name: String,
    statements: RwLock<HashMap<usize, Arc<str>>>,
}

impl Schema {
    /// Checks `name`: 1 to 48 bytes of `a-z 0-9 _`, not starting with a digit, so it
    /// needs no escaping inside `[...]` or `N'...'`.
    pub(crate) fn new(name: &str) -> Result<Self> {
        let valid = !name.is_empty()
            && name.len() <= 48
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::invalid(
                "schema",
                format!(
                    "{name:?} must be 1 to 48 bytes of a-z, 0-9 and _, not starting with a digit"
                ),
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            statements: RwLock::default(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `template` written for this schema, cached by the template's address.
    pub(crate) fn sql(&self, template: &'static str) -> Arc<str> {
        let key = template.as_ptr() as usize;
        let cached = self
            .statements
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        cached.unwrap_or_else(|| {
            let sql: Arc<str> = self.fill(template).into();
            self.statements
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, sql.clone());
            sql
        })
    }

    pub(crate) fn fill(&self, template: &str) -> String {
        template
            .replace("{s}", &format!("[{}]", self.name))
            .replace("{n}", &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for ok in ["relayq", "a", "_x", "app_2", &"a".repeat(48)] {
            assert!(Schema::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "1a", "a-b", "a]b", "a'b", "a b", &"a".repeat(49)] {
            let err = Schema::new(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidInput {
                        field: "schema",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn statements_get_the_quoted_schema() {
        let s = Schema::new("app").unwrap();
        assert_eq!(
            &*s.sql("SELECT 1 FROM {s}.jobs WHERE x = N'{n}'"),
            "SELECT 1 FROM [app].jobs WHERE x = N'app'"
        );
    }
}
