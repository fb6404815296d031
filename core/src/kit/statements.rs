//! [`Statements`]: for SQL backends, a validated schema name and the statement
//! templates written for it, each filled in once and cached.
//!
//! Identifiers cannot be bound as parameters, so a template says `{s}` where the
//! (validated, quoted) schema goes, `{n}` for its bare name, and `{limit}` for a limit
//! written into the text; values are always bound (SPEC X2).
//!
//! ```
//! use relayq_core::kit::Statements;
//! let s = Statements::new("app", |name| format!("\"{name}\""))?;
//! assert_eq!(&*s.sql("SELECT 1 FROM {s}.jobs"), "SELECT 1 FROM \"app\".jobs");
//! assert_eq!(&*s.sql_limit("SELECT 1 FROM {s}.jobs LIMIT {limit}", 8), "SELECT 1 FROM \"app\".jobs LIMIT 8");
//! assert!(Statements::new("a\"b", |n| n.to_owned()).is_err());
//! # Ok::<(), relayq_core::Error>(())
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
};

use crate::{Result, validate};

/// A schema name and its filled-in statements (see the [module](self)).
#[derive(Debug)]
pub struct Statements {
    name: String,
    quoted: String,
    cache: RwLock<HashMap<(usize, u32), Arc<str>>>,
}

impl Statements {
    /// Checks `name` ([`validate::schema_name`]: 1 to 48 bytes of `a-z 0-9 _`, not
    /// starting with a digit, so it needs no escaping) and quotes it with `quote`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) on `schema`.
    pub fn new(name: &str, quote: fn(&str) -> String) -> Result<Self> {
        validate::schema_name(name)?;
        Ok(Self {
            name: name.to_owned(),
            quoted: quote(name),
            cache: RwLock::default(),
        })
    }

    /// The schema's bare name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `template` filled in, from the cache after the first time.
    #[must_use]
    pub fn sql(&self, template: &'static str) -> Arc<str> {
        self.cached(template, 0)
    }

    /// `template` filled in, with `{limit}` replaced by `limit`: one cached statement
    /// per distinct limit, so callers round limits to a few values.
    #[must_use]
    pub fn sql_limit(&self, template: &'static str, limit: u32) -> Arc<str> {
        self.cached(template, limit)
    }

    /// `template` filled in, not cached: for statements run once (migrations).
    #[must_use]
    pub fn fill(&self, template: &str) -> String {
        template
            .replace("{s}", &self.quoted)
            .replace("{n}", &self.name)
    }

    fn cached(&self, template: &'static str, limit: u32) -> Arc<str> {
        // Templates are `'static` strings: their address is key enough.
        let key = (template.as_ptr() as usize, limit);
        let hit = self
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        hit.unwrap_or_else(|| {
            let sql: Arc<str> = self
                .fill(template)
                .replace("{limit}", &limit.to_string())
                .into();
            self.cache
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, sql.clone());
            sql
        })
    }
}
