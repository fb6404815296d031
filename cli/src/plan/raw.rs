//! The plan file as TOML gives it, every field with its span, before validation.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    pub name: Option<Spanned<String>>,
    pub on_failure: Option<Spanned<String>>,
    /// The limit of every limit key of the queue without one of its own (SPEC K1).
    pub each_key_limit: Option<Spanned<i64>>,
    /// Limits of named keys.
    pub key_limits: Option<Spanned<BTreeMap<String, i64>>>,
    /// The queue's rate, `N/1s` (SPEC K8), and its burst.
    pub rate: Option<Spanned<String>>,
    pub rate_burst: Option<Spanned<i64>>,
    /// What a job does when a job it runs after fails, unless it says (SPEC D4).
    pub after_failure: Option<Spanned<String>>,
    #[serde(default)]
    pub job: Vec<Spanned<RawJob>>,
}

/// One `[[job]]` table. Numbers are read wide and range-checked by the plan, so that
/// an out-of-range value gets an error naming its job and field.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJob {
    pub name: Option<Spanned<String>>,
    pub command: Option<Spanned<String>>,
    pub stage: Option<Spanned<i64>>,
    pub group: Option<Spanned<String>>,
    pub limit_key: Option<Spanned<String>>,
    pub priority: Option<Spanned<i64>>,
    pub max_attempts: Option<Spanned<i64>>,
    pub timeout: Option<Spanned<String>>,
    pub env: Option<Spanned<BTreeMap<String, String>>>,
    pub cwd: Option<Spanned<String>>,
    /// The names of the jobs of the plan it runs after (SPEC D1).
    pub after: Option<Spanned<Vec<String>>>,
    pub after_failure: Option<Spanned<String>>,
}
