//! Plans: a TOML list of shell commands with stages, groups and limits; parsed and
//! validated whole before anything is stored.
//!
//! Errors name the file, line and column; validation errors also name the job (its
//! 1-based position among the `[[job]]` tables, and its name) and the field.

mod check;
mod location;
mod raw;

use std::{collections::HashMap, fmt, ops::Range, path::Path};

use relayq_core::{AfterFailure, BatchId, Error as CoreError, Limits, NewJob, OnFailure, validate};

use crate::spec::{CommandSpec, shorten};
use check::Ctx;
use raw::RawPlan;

/// Attempts a plan job gets unless it says otherwise: one. Plan steps are shell
/// commands with side effects relayq cannot see (loads, migrations, deploys), so
/// running one again is something the plan asks for with `max_attempts`, not a default;
/// a failing step also fails at once, so a `halt` plan stops without waiting for
/// backoffs.
pub const DEFAULT_MAX_ATTEMPTS: u16 = 1;

/// A validated plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The batch's name: the plan's `name`, or the file's name without its extension.
    pub name: String,
    /// What a dead job does to the rest of the batch.
    pub on_failure: OnFailure,
    /// What a job does when a job it runs after fails, unless it says (SPEC D4).
    pub after_failure: AfterFailure,
    /// Limits set on the queue before the jobs are stored: for each named key, or with
    /// `None` for every key without a limit of its own (SPEC K1).
    pub key_limits: Vec<(Option<String>, u32)>,
    /// The queue's rate, set before the jobs are stored (SPEC K8).
    pub rate: Option<relayq_core::Rate>,
    /// The jobs, in file order.
    pub jobs: Vec<PlanJob>,
    /// The file, as named on the command line (for messages).
    pub file: String,
}

/// One validated job.
#[derive(Debug, Clone)]
pub struct PlanJob {
    /// Its 1-based position among the `[[job]]` tables.
    pub index: usize,
    /// What to run.
    pub spec: CommandSpec,
    /// Its stage (default 0).
    pub stage: i32,
    /// Its group.
    pub group: Option<String>,
    /// Its limit key (SPEC K1).
    pub limit_key: Option<String>,
    /// Its priority (lower runs first; default 0).
    pub priority: i16,
    /// Attempts it gets (default [`DEFAULT_MAX_ATTEMPTS`]).
    pub max_attempts: u16,
    /// The jobs it runs after, by their place in [`Plan::jobs`] (SPEC D1).
    pub after: Vec<usize>,
    /// Its own dependency policy, if it names one (SPEC D4).
    pub after_failure: Option<AfterFailure>,
    spans: HashMap<&'static str, Range<usize>>,
}

/// A bad plan: the message names file, line, column and, where it applies, the job and
/// the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

/// Reads and validates the plan at `path`. Relative `cwd`s are made absolute against
/// the current directory.
///
/// # Errors
/// [`PlanError`] when the file cannot be read or the plan is not valid.
pub fn load(path: &Path) -> Result<Plan, PlanError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| PlanError(format!("{file}: cannot read the plan: {e}")))?;
    let base = std::env::current_dir()
        .map_err(|e| PlanError(format!("cannot read the current directory: {e}")))?;
    let plan = parse(&file, &text, &base)?;
    check_folders(&plan, &text)?;
    Ok(plan)
}

/// Checks that every job's `cwd` is a folder, before anything is stored: a missing one
/// would otherwise be found only when the job runs, perhaps hours into the plan.
fn check_folders(plan: &Plan, text: &str) -> Result<(), PlanError> {
    let ctx = Ctx {
        file: &plan.file,
        text,
    };
    for job in &plan.jobs {
        let Some(dir) = &job.spec.cwd else { continue };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(job.error(&ctx, "cwd", &format!("{dir} is not a folder"))),
            Err(e) => {
                return Err(job.error(&ctx, "cwd", &format!("cannot use folder {dir}: {e}")));
            }
        }
    }
    Ok(())
}

/// The number in serde's "invalid type: integer `N` as i128, ..." (a TOML integer
/// beyond i64), if that is the message.
fn beyond_i64(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("invalid type: integer `")?;
    rest.split_once("` as i128").map(|(n, _)| n)
}

/// A plan's name when it gives none: its file's name without the extension, cut to
/// a label's 255 bytes.
fn default_name(file: &str) -> String {
    let stem = Path::new(file)
        .file_stem()
        .map_or_else(|| file.into(), |s| s.to_string_lossy());
    let mut name: String = stem.chars().filter(|c| !c.is_control()).collect();
    while name.len() > 255 {
        name.pop();
    }
    if name.is_empty() { "plan".into() } else { name }
}

/// The plan's `each_key_limit` and `[key_limits]`, each 1 or more, keys checked as
/// labels.
fn key_limits(ctx: &Ctx<'_>, raw: &RawPlan) -> Result<Vec<(Option<String>, u32)>, PlanError> {
    let limit = |field: &str, key: Option<&str>, n: i64, span: Range<usize>| {
        u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            let which = key.map_or_else(String::new, |k| format!(" (key {k:?})"));
            ctx.error(
                span,
                &format!("field {field:?}{which}: must be 1 or more, got {n}"),
            )
        })
    };
    let mut out = Vec::new();
    if let Some(n) = &raw.each_key_limit {
        out.push((None, limit("each_key_limit", None, *n.get_ref(), n.span())?));
    }
    if let Some(keys) = &raw.key_limits {
        for (key, n) in keys.get_ref() {
            validate::label("limit_key", key).map_err(|e| {
                ctx.error(
                    keys.span(),
                    &format!("field \"key_limits\": key {key:?}: {}", check::reason(&e)),
                )
            })?;
            out.push((
                Some(key.clone()),
                limit("key_limits", Some(key), *n, keys.span())?,
            ));
        }
    }
    Ok(out)
}

/// The plan's `rate` and `rate_burst`, checked with the core's rules.
fn rate(ctx: &Ctx<'_>, raw: &RawPlan) -> Result<Option<relayq_core::Rate>, PlanError> {
    let Some(text) = &raw.rate else {
        if let Some(burst) = &raw.rate_burst {
            return Err(ctx.error(burst.span(), "field \"rate_burst\": needs a `rate`"));
        }
        return Ok(None);
    };
    let bad = |span: Range<usize>, field: &str, e: &relayq_core::Error| {
        ctx.error(span, &format!("field {field:?}: {}", check::reason(e)))
    };
    let mut rate: relayq_core::Rate = text
        .get_ref()
        .parse()
        .map_err(|e| bad(text.span(), "rate", &e))?;
    if let Some(burst) = &raw.rate_burst {
        let n = *burst.get_ref();
        let Ok(n) = u32::try_from(n) else {
            let why = format!("field \"rate_burst\": must be 1 to the rate's count, got {n}");
            return Err(ctx.error(burst.span(), &why));
        };
        rate = rate.with_burst(n);
        validate::rate(&rate).map_err(|e| bad(burst.span(), "rate_burst", &e))?;
    }
    Ok(Some(rate))
}

/// Parses and validates plan `text` (from `file`); relative `cwd`s are joined to `base`.
///
/// # Errors
/// [`PlanError`] naming the first problem found.
pub fn parse(file: &str, text: &str, base: &Path) -> Result<Plan, PlanError> {
    let raw: RawPlan = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        let (line, col) = location::line_col(text, at);
        let place = match location::job_and_key(text, at) {
            (Some(job), Some(key)) => format!("job {job}: field {key:?}: "),
            (Some(job), None) => format!("job {job}: "),
            (None, Some(key)) => format!("field {key:?}: "),
            (None, None) => String::new(),
        };
        // Numbers are read as i64 and range-checked later; "an integer" says it better.
        // One past i64 reaches serde as an i128, whose message names the Rust type.
        let message = e.message().trim_end();
        let message = match beyond_i64(message) {
            Some(n) => format!("{n} is out of range"),
            None => message.replace("expected i64", "expected an integer"),
        };
        PlanError(format!(
            "{file}:{line}:{col}: {place}{message}\n{}",
            location::snippet(text, at)
        ))
    })?;
    let ctx = Ctx { file, text };
    let on_failure = match &raw.on_failure {
        None => OnFailure::default(),
        Some(v) => v.get_ref().parse().map_err(|_| {
            ctx.error(
                v.span(),
                &format!(
                    "field \"on_failure\": expected \"continue\" or \"halt\", got {:?}",
                    v.get_ref()
                ),
            )
        })?,
    };
    let name = match &raw.name {
        Some(v) => {
            relayq_core::validate::label("name", v.get_ref()).map_err(|e| {
                ctx.error(v.span(), &format!("field \"name\": {}", check::reason(&e)))
            })?;
            v.get_ref().clone()
        }
        None => default_name(file),
    };
    let key_limits = key_limits(&ctx, &raw)?;
    let rate = rate(&ctx, &raw)?;
    if raw.job.is_empty() {
        return Err(PlanError(format!(
            "{file}: the plan has no jobs (add [[job]] tables, each with a `command`)"
        )));
    }
    let mut jobs = Vec::with_capacity(raw.job.len());
    let mut names: HashMap<String, usize> = HashMap::new();
    for (i, job) in raw.job.iter().enumerate() {
        let job = ctx.job(i + 1, job, base)?;
        if let Some(name) = &job.spec.name
            && let Some(first) = names.insert(name.clone(), job.index)
        {
            return Err(job.error(
                &ctx,
                "name",
                &format!("{name:?} is already the name of job {first}"),
            ));
        }
        jobs.push(job);
    }
    after(&ctx, &raw, &mut jobs, &names)?;
    let after_failure = match &raw.after_failure {
        None => AfterFailure::default(),
        Some(v) => v.get_ref().parse().map_err(|_| {
            ctx.error(
                v.span(),
                &format!(
                    "field \"after_failure\": expected \"cancel\" or \"run\", got {:?}",
                    v.get_ref()
                ),
            )
        })?,
    };
    Ok(Plan {
        name,
        on_failure,
        after_failure,
        key_limits,
        rate,
        jobs,
        file: file.to_owned(),
    })
}

/// Each job's `after`, names resolved to jobs of the plan (SPEC D1, D5): every name is
/// a job's, not its own, once, of the same stage or a lower one; and no cycle, which
/// is named job by job.
fn after(
    ctx: &Ctx<'_>,
    raw: &RawPlan,
    jobs: &mut [PlanJob],
    names: &HashMap<String, usize>,
) -> Result<(), PlanError> {
    for (i, r) in raw.job.iter().enumerate() {
        let Some(after) = &r.get_ref().after else {
            continue;
        };
        let mut parents = Vec::new();
        for name in after.get_ref() {
            let why = match names.get(name).map(|n| n - 1) {
                None => Some(format!("no job is named {name:?}")),
                Some(p) if p == i => Some("a job cannot run after itself".to_owned()),
                Some(p) if parents.contains(&p) => Some(format!("names {name:?} twice")),
                Some(p) if jobs[p].stage > jobs[i].stage => Some(format!(
                    "{} is in stage {}, above this job's stage {}",
                    jobs[p].label(),
                    jobs[p].stage,
                    jobs[i].stage
                )),
                Some(p) => {
                    parents.push(p);
                    None
                }
            };
            if let Some(why) = why {
                return Err(jobs[i].error(ctx, "after", &why));
            }
        }
        jobs[i].after = parents;
    }
    let edges: Vec<Vec<usize>> = jobs.iter().map(|j| j.after.clone()).collect();
    if let Some(cycle) = relayq_core::after::find_cycle(jobs.len(), |i| &edges[i]) {
        let mut names: Vec<String> = cycle.iter().map(|&i| jobs[i].label()).collect();
        names.push(jobs[cycle[0]].label());
        let why = format!("a cycle: {}", names.join(" runs after "));
        return Err(jobs[cycle[0]].error(ctx, "after", &why));
    }
    Ok(())
}

impl Plan {
    /// The jobs as `NewJob`s of `queue` in `batch`, checked with the core's rules
    /// (queue name, payload size, attempts, group label) before anything is stored.
    ///
    /// # Errors
    /// [`PlanError`] naming the job and field the core rejects, or the queue.
    pub fn new_jobs(&self, queue: &str, batch: BatchId) -> Result<Vec<NewJob>, PlanError> {
        validate::queue_name(queue).map_err(|e| PlanError(format!("--queue {queue:?}: {e}")))?;
        let by = format!("relayq run {}", shorten(&self.file, 200)).replace(char::is_control, "?");
        // The backend says whether it keeps limit keys when the jobs are stored.
        let limits = Limits {
            limit_keys: true,
            dependencies: true,
            ..Limits::default()
        };
        let mut out = Vec::with_capacity(self.jobs.len());
        for job in &self.jobs {
            let mut new = NewJob::new(queue, job.spec.to_payload())
                .in_batch(batch, job.stage)
                .priority(job.priority)
                .max_attempts(job.max_attempts)
                .enqueued_by(by.clone());
            if let Some(group) = &job.group {
                new = new.group(group.clone());
            }
            if let Some(key) = &job.limit_key {
                new = new.limit_key(key.clone());
            }
            for p in &job.after {
                new = new.after_call(*p);
            }
            if let Some(policy) = job.after_failure {
                new = new.after_failure(policy);
            }
            validate::new_job(&new, &limits).map_err(|e| match e {
                CoreError::InvalidInput { field, reason } => {
                    job.error_in(&self.file, field, &reason)
                }
                other => PlanError(format!("{}: job {}: {other}", self.file, job.index)),
            })?;
            out.push(new);
        }
        validate::new_jobs(&out, &limits).map_err(|e| PlanError(format!("{}: {e}", self.file)))?;
        Ok(out)
    }

    /// Whether a job runs after another (SPEC D).
    pub fn has_after(&self) -> bool {
        self.jobs.iter().any(|j| !j.after.is_empty())
    }

    /// The stages of the plan with their job counts, ascending.
    pub fn stages(&self) -> Vec<(i32, u64)> {
        let mut counts = std::collections::BTreeMap::new();
        for job in &self.jobs {
            *counts.entry(job.stage).or_insert(0u64) += 1;
        }
        counts.into_iter().collect()
    }
}

impl PlanJob {
    /// `job 3 ("load")`, or `job 3` for a job without a name.
    pub fn label(&self) -> String {
        match &self.spec.name {
            Some(name) => format!("job {} ({name:?})", self.index),
            None => format!("job {}", self.index),
        }
    }

    fn error(&self, ctx: &Ctx<'_>, field: &str, reason: &str) -> PlanError {
        let span = self.spans.get(field).or_else(|| self.spans.get("job"));
        let at = span.map_or_else(String::new, |s| {
            let (line, col) = location::line_col(ctx.text, s.start);
            format!("{line}:{col}:")
        });
        PlanError(format!(
            "{}:{at} {}: field {field:?}: {reason}",
            ctx.file,
            self.label()
        ))
    }

    /// An error for a core validation failure: the core names the field, the plan file
    /// is no longer at hand, so no line number.
    fn error_in(&self, file: &str, field: &str, reason: &str) -> PlanError {
        PlanError(format!(
            "{file}: {}: field {field:?}: {reason}",
            self.label()
        ))
    }
}

#[cfg(test)]
mod tests;
