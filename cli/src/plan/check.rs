//! Checking one `[[job]]` table: every field, with errors naming the job, the field
//! and its line and column.

use std::{ops::Range, path::Path, time::Duration};

use relayq_core::{Error as CoreError, validate};
use toml::Spanned;

use super::{DEFAULT_MAX_ATTEMPTS, PlanError, PlanJob, location, raw::RawJob};
use crate::spec::CommandSpec;

/// The plan file being checked.
pub(super) struct Ctx<'a> {
    pub(super) file: &'a str,
    pub(super) text: &'a str,
}

impl Ctx<'_> {
    pub(super) fn error(&self, span: Range<usize>, msg: &str) -> PlanError {
        let (line, col) = location::line_col(self.text, span.start);
        PlanError(format!("{}:{line}:{col}: {msg}", self.file))
    }

    /// Validates job `index` (1-based).
    pub(super) fn job(
        &self,
        index: usize,
        raw: &Spanned<RawJob>,
        base: &Path,
    ) -> Result<PlanJob, PlanError> {
        let r = raw.get_ref();
        let spans = [
            ("name", span(r.name.as_ref())),
            ("command", span(r.command.as_ref())),
            ("stage", span(r.stage.as_ref())),
            ("group", span(r.group.as_ref())),
            ("limit_key", span(r.limit_key.as_ref())),
            ("priority", span(r.priority.as_ref())),
            ("max_attempts", span(r.max_attempts.as_ref())),
            ("timeout", span(r.timeout.as_ref())),
            ("env", span(r.env.as_ref())),
            ("cwd", span(r.cwd.as_ref())),
            ("after", span(r.after.as_ref())),
            ("after_failure", span(r.after_failure.as_ref())),
            ("job", Some(raw.span())),
        ]
        .into_iter()
        .filter_map(|(field, s)| Some((field, s?)))
        .collect();

        let mut job = PlanJob {
            index,
            spec: CommandSpec::new(""),
            stage: 0,
            group: r.group.as_ref().map(|g| g.get_ref().clone()),
            limit_key: r.limit_key.as_ref().map(|k| k.get_ref().clone()),
            priority: 0,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            after: Vec::new(),
            after_failure: None,
            spans,
        };
        // The name first, so that every later error can show it.
        if let Some(name) = &r.name {
            validate::label("name", name.get_ref())
                .map_err(|e| job.error(self, "name", &reason(&e)))?;
            job.spec.name = Some(name.get_ref().clone());
        }
        let Some(command) = &r.command else {
            return Err(job.error(self, "command", "missing: every job needs a command"));
        };
        let command = command.get_ref();
        if command.trim().is_empty() {
            return Err(job.error(self, "command", "is empty"));
        }
        if command.contains('\0') {
            return Err(job.error(self, "command", "contains a NUL byte"));
        }
        job.spec.command.clone_from(command);
        if let Some(stage) = &r.stage {
            job.stage = i32::try_from(*stage.get_ref()).map_err(|_| {
                job.error(
                    self,
                    "stage",
                    &format!("{} is out of range (a 32-bit integer)", stage.get_ref()),
                )
            })?;
        }
        if let Some(p) = &r.priority {
            job.priority = i16::try_from(*p.get_ref()).map_err(|_| {
                job.error(
                    self,
                    "priority",
                    &format!("{} is out of range -32768..=32767", p.get_ref()),
                )
            })?;
        }
        if let Some(m) = &r.max_attempts {
            job.max_attempts = u16::try_from(*m.get_ref())
                .ok()
                .filter(|m| (1..=1000).contains(m))
                .ok_or_else(|| {
                    job.error(
                        self,
                        "max_attempts",
                        &format!("must be 1..=1000, got {}", m.get_ref()),
                    )
                })?;
        }
        if let Some(t) = &r.timeout {
            job.spec.timeout_ms =
                Some(timeout_ms(t.get_ref()).map_err(|why| job.error(self, "timeout", &why))?);
        }
        if let Some(env) = &r.env {
            for (key, value) in env.get_ref() {
                if key.is_empty() || key.contains(['=', '\0']) {
                    return Err(job.error(
                        self,
                        "env",
                        &format!("invalid variable name {key:?} (empty, or has '=' or NUL)"),
                    ));
                }
                if value.contains('\0') {
                    return Err(job.error(
                        self,
                        "env",
                        &format!("the value of {key:?} contains a NUL byte"),
                    ));
                }
            }
            job.spec.env.clone_from(env.get_ref());
        }
        if let Some(policy) = &r.after_failure {
            job.after_failure = Some(policy.get_ref().parse().map_err(|_| {
                job.error(
                    self,
                    "after_failure",
                    &format!("expected \"cancel\" or \"run\", got {:?}", policy.get_ref()),
                )
            })?);
        }
        if let Some(cwd) = &r.cwd {
            let dir = cwd.get_ref();
            if dir.is_empty() || dir.contains('\0') {
                return Err(job.error(self, "cwd", "must be a non-empty path without NUL"));
            }
            job.spec.cwd = Some(base.join(dir).display().to_string());
        }
        Ok(job)
    }
}

/// A `timeout` value in milliseconds: humantime syntax ("500ms", "30s", "2m", "1h 30m"),
/// above zero.
fn timeout_ms(text: &str) -> Result<u64, String> {
    let d: Duration = humantime::parse_duration(text).map_err(|e| {
        format!("invalid duration {text:?} ({e}; write e.g. \"500ms\", \"30s\", \"2m\")")
    })?;
    if d.is_zero() {
        return Err(format!("invalid duration {text:?}: must be above zero"));
    }
    u64::try_from(d.as_millis()).map_err(|_| format!("invalid duration {text:?}: too long"))
}

fn span<T>(value: Option<&Spanned<T>>) -> Option<Range<usize>> {
    value.map(Spanned::span)
}

pub(super) fn reason(e: &CoreError) -> String {
    match e {
        CoreError::InvalidInput { reason, .. } => reason.to_string(),
        other => other.to_string(),
    }
}
