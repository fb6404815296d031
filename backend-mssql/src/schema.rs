//! The schema relayq lives in: its validated name and the statements written for it.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
};

use relayq_core::Result;

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
        relayq_core::validate::schema_name(name)?;
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
    use relayq_core::Error;

    use super::*;

    #[test]
    fn bad_schema_names_are_refused() {
        // The rules are core's (`validate::schema_name`); a quote would break the SQL.
        assert!(Schema::new("relayq_2").is_ok());
        assert!(matches!(
            Schema::new("a\"b]c"),
            Err(Error::InvalidInput {
                field: "schema",
                ..
            })
        ));
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
