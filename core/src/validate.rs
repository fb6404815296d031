//! Input validation, done once here for every backend (SPEC E4, C1, X2).
//!
//! Each backend calls these before any I/O, so bad input is rejected with
//! [`Error::InvalidInput`] naming the field, and nothing is stored.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

pub use crate::schedule::check::{schedule, schedule_name};
use crate::{
    ClaimRequest, Error, NewJob, Outcome, Result, Retry, RunAt, Settle,
    progress::{MAX_PROGRESS_MESSAGE, MAX_RESULT_BYTES, ProgressReport},
};

/// Default payload limit: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// Most jobs one enqueue call may carry (keeps every backend's one statement or script
/// within its parameter limits).
pub const MAX_JOBS_PER_ENQUEUE: usize = 10_000;
/// Most dependencies (`after` entries) one enqueue call may carry, over all its jobs.
pub const MAX_AFTER_PER_ENQUEUE: usize = 100_000;
/// Most jobs one claim may return (SPEC C1).
pub const MAX_CLAIM_LIMIT: u32 = 1000;
/// Most leases one settle call may carry.
pub const MAX_SETTLE: usize = 1000;
/// Longest lease or heartbeat extension.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest queue name, in bytes.
pub const MAX_QUEUE_NAME: usize = 128;
/// Longest group, dedupe key, worker or `enqueued_by` text, in bytes.
pub const MAX_LABEL: usize = 255;
/// Furthest delay accepted for `run_at` or a retry: 100 years.
const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Limits a backend is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload accepted, in bytes. Default 1 MiB.
    pub max_payload: usize,
    /// Whether the backend keeps limit keys (SPEC K1); a backend that does not refuses
    /// jobs that carry one. Default false, so a new backend refuses them until it
    /// enforces them.
    pub limit_keys: bool,
    /// Whether the backend keeps queue rates (SPEC K8); one that does not refuses a
    /// rate in `update_queue` with `InvalidInput` on `rate`. Default false.
    pub rates: bool,
    /// Whether the backend keeps dependencies between jobs (SPEC D); one that does not
    /// refuses jobs with `after` on `after`. Default false.
    pub dependencies: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload: DEFAULT_MAX_PAYLOAD,
            limit_keys: false,
            rates: false,
            dependencies: false,
        }
    }
}

/// Checks a queue name: 1 to 128 bytes of `A-Z a-z 0-9 _ - . :`.
///
/// # Errors
/// [`Error::InvalidInput`] on field `queue`.
pub fn queue_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_QUEUE_NAME {
        return Err(Error::invalid(
            "queue",
            format!("must be 1 to {MAX_QUEUE_NAME} bytes, got {}", name.len()),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(Error::invalid(
            "queue",
            format!("may hold only A-Z a-z 0-9 _ - . : but has {bad:?}"),
        ));
    }
    // A name of dots only is a path segment in the dashboard's URLs (`/queues/../dead`),
    // which browsers and proxies rewrite before the request is sent.
    if name.bytes().all(|b| b == b'.') {
        return Err(Error::invalid(
            "queue",
            format!("{name:?} is dots only, a path segment in URLs"),
        ));
    }
    Ok(())
}

/// Checks the name of the schema a SQL backend keeps its tables in: 1 to 48 bytes of
/// `a-z 0-9 _`, not starting with a digit. Such a name needs no escaping in any SQL
/// dialect's quoted identifiers or string literals, and leaves room for names derived
/// from it (PostgreSQL's notification channel, 63 bytes at most).
///
/// # Errors
/// [`Error::InvalidInput`] on field `schema`.
pub fn schema_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 48
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        return Ok(());
    }
    Err(Error::invalid(
        "schema",
        format!("{name:?} must be 1 to 48 bytes of a-z, 0-9 and _, not starting with a digit"),
    ))
}

/// Checks free text stored as a label (group, dedupe key, worker, `enqueued_by`): 1 to
/// 255 bytes, no control characters. Quotes, brackets and braces are stored verbatim.
///
/// # Errors
/// [`Error::InvalidInput`] on `field`.
pub fn label(field: &'static str, text: &str) -> Result<()> {
    if text.is_empty() || text.len() > MAX_LABEL {
        return Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_LABEL} bytes, got {}", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            "must not contain control characters (NUL, newline, ...)",
        ));
    }
    Ok(())
}

fn delay(field: &'static str, d: Duration) -> Result<()> {
    if d > MAX_DELAY {
        return Err(Error::invalid(field, "is more than 100 years away"));
    }
    Ok(())
}

pub(crate) fn instant(field: &'static str, t: DateTime<Utc>) -> Result<()> {
    let low = Utc.timestamp_opt(0, 0).single().expect("epoch is valid");
    let high = Utc
        .with_ymd_and_hms(9999, 12, 31, 0, 0, 0)
        .single()
        .expect("year 9999 is valid");
    if t < low || t > high {
        return Err(Error::invalid(field, "must lie between 1970 and 9999"));
    }
    Ok(())
}

/// Checks a queue's concurrency limit (SPEC C6): `None` lifts it; zero is refused,
/// since pausing is what stops a queue.
///
/// # Errors
/// [`Error::InvalidInput`] on `max_running` for zero.
pub fn max_running(max: Option<u32>) -> Result<()> {
    if max == Some(0) {
        return Err(Error::invalid(
            "max_running",
            "must be at least 1; use pause to stop a queue",
        ));
    }
    Ok(())
}

/// Checks a per-key limit (SPEC K1): `None` lifts it; zero is refused.
///
/// # Errors
/// [`Error::InvalidInput`] on `key_limit` for zero.
pub fn key_limit(limit: Option<u32>) -> Result<()> {
    if limit == Some(0) {
        return Err(Error::invalid(
            "key_limit",
            "must be at least 1; lift it with none, or pause the queue",
        ));
    }
    Ok(())
}

/// Largest `count` of a [`Rate`](crate::Rate).
pub const MAX_RATE_COUNT: u32 = 1_000_000;

/// Checks a rate (SPEC K8): `count` 1..=1,000,000, `per` 1 ms to 1 day in whole
/// milliseconds, `burst` 1..=`count`.
///
/// # Errors
/// [`Error::InvalidInput`] on `rate`.
pub fn rate(rate: &crate::Rate) -> Result<()> {
    if !(1..=MAX_RATE_COUNT).contains(&rate.count) {
        return Err(Error::invalid(
            "rate",
            format!("count must be 1 to {MAX_RATE_COUNT}, got {}", rate.count),
        ));
    }
    let day = std::time::Duration::from_secs(86_400);
    if rate.per < std::time::Duration::from_millis(1)
        || rate.per > day
        || !rate.per.subsec_nanos().is_multiple_of(1_000_000)
    {
        return Err(Error::invalid(
            "rate",
            format!(
                "interval must be 1 ms to 1 day in whole milliseconds, got {:?}",
                rate.per
            ),
        ));
    }
    if rate.burst == 0 || rate.burst > rate.count {
        return Err(Error::invalid(
            "rate",
            format!(
                "burst must be 1 to the count ({}), got {}",
                rate.count, rate.burst
            ),
        ));
    }
    // The rate's value lives ahead of now by up to `burst` intervals; kept within ten
    // years, every backend's arithmetic on it is exact (Redis's Lua has doubles).
    let ahead = i128::from(rate.burst) * i128::from(rate.emission_us());
    if ahead > 10 * 365 * 86_400_000_000 {
        return Err(Error::invalid(
            "rate",
            "burst × (interval ÷ (count − burst + 1)) must be at most ten years",
        ));
    }
    Ok(())
}

/// Refuses a queue update that sets a rate on a backend whose `limits` keep none
/// (SPEC K8); lifting one is allowed, and changes nothing there.
///
/// # Errors
/// [`Error::InvalidInput`] on `rate`.
pub fn rate_kept(update: &crate::QueueUpdate, limits: &Limits) -> Result<()> {
    if matches!(update.rate, Some(Some(_))) && !limits.rates {
        return Err(Error::invalid(
            "rate",
            "this backend does not keep rates yet",
        ));
    }
    Ok(())
}

/// Checks one job against `limits`.
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bad field.
pub fn new_job(job: &NewJob, limits: &Limits) -> Result<()> {
    queue_name(&job.queue)?;
    if job.payload.len() > limits.max_payload {
        return Err(Error::invalid(
            "payload",
            format!(
                "is {} bytes, more than the limit of {}",
                job.payload.len(),
                limits.max_payload
            ),
        ));
    }
    if !(1..=1000).contains(&job.max_attempts) {
        return Err(Error::invalid(
            "max_attempts",
            format!("must be 1..=1000, got {}", job.max_attempts),
        ));
    }
    match job.run_at {
        RunAt::Now => {}
        RunAt::After(d) => delay("run_at", d)?,
        RunAt::At(t) => instant("run_at", t)?,
    }
    if job.stage.is_some() && job.batch.is_none() {
        return Err(Error::invalid("stage", "a stage needs a batch"));
    }
    if let Some(group) = &job.group {
        label("group", group)?;
    }
    if let Some(key) = &job.dedupe_key {
        label("dedupe_key", key)?;
    }
    if let Some(who) = &job.enqueued_by {
        label("enqueued_by", who)?;
    }
    if !job.after.is_empty() {
        if !limits.dependencies {
            return Err(Error::invalid(
                "after",
                "this backend does not keep dependencies yet",
            ));
        }
        if job.batch.is_none() {
            return Err(Error::invalid("after", "dependencies need a batch"));
        }
    }
    if let Some(key) = &job.limit_key {
        label("limit_key", key)?;
        if !limits.limit_keys {
            return Err(Error::invalid(
                "limit_key",
                "this backend does not keep limit keys",
            ));
        }
    }
    Ok(())
}

/// Checks the jobs of one enqueue call: each job, their count, and that they share one
/// queue (one call is atomic, which Redis Cluster can promise only within one queue).
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bad field.
pub fn new_jobs(jobs: &[NewJob], limits: &Limits) -> Result<()> {
    if jobs.len() > MAX_JOBS_PER_ENQUEUE {
        return Err(Error::invalid(
            "jobs",
            format!(
                "at most {MAX_JOBS_PER_ENQUEUE} jobs per call, got {}",
                jobs.len()
            ),
        ));
    }
    for job in jobs {
        new_job(job, limits)?;
        if job.queue != jobs[0].queue {
            return Err(Error::invalid(
                "queue",
                "all jobs of one enqueue call must share one queue",
            ));
        }
    }
    after(jobs)
}

/// SPEC D1, D5: the `after` entries of one call, checked before anything is stored.
/// Jobs already stored are the backend's to check (they must be in the batch, at a
/// stage no higher); here, the call's own: each names a job of the call other than
/// itself, once, in the same batch, at the same stage or a lower one, without a
/// dedupe key (its edge could land on another batch's job), and no cycle.
fn after(jobs: &[NewJob]) -> Result<()> {
    let total: usize = jobs.iter().map(|j| j.after.len()).sum();
    if total == 0 {
        return Ok(());
    }
    if total > MAX_AFTER_PER_ENQUEUE {
        return Err(Error::invalid(
            "after",
            format!("at most {MAX_AFTER_PER_ENQUEUE} dependencies per call, got {total}"),
        ));
    }
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); jobs.len()];
    for (i, job) in jobs.iter().enumerate() {
        let mut seen = std::collections::HashSet::new();
        for dep in &job.after {
            if !seen.insert(*dep) {
                return Err(Error::invalid(
                    "after",
                    format!("jobs[{i}] names {} twice", describe(*dep)),
                ));
            }
            let crate::After::Call(p) = *dep else {
                continue;
            };
            let Some(parent) = jobs.get(p) else {
                return Err(Error::invalid(
                    "after",
                    format!(
                        "jobs[{i}] runs after jobs[{p}], but the call has {} jobs",
                        jobs.len()
                    ),
                ));
            };
            let why = if p == i {
                Some("itself".to_owned())
            } else if parent.batch != job.batch {
                Some(format!("jobs[{p}], which is not in its batch"))
            } else if parent.stage.unwrap_or(0) > job.stage.unwrap_or(0) {
                Some(format!(
                    "jobs[{p}], of stage {}, above its own stage {}",
                    parent.stage.unwrap_or(0),
                    job.stage.unwrap_or(0)
                ))
            } else if parent.dedupe_key.is_some() {
                Some(format!(
                    "jobs[{p}], which has a dedupe key and could be another batch's job"
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::invalid(
                    "after",
                    format!("jobs[{i}] runs after {why}"),
                ));
            }
            edges[i].push(p);
        }
    }
    if let Some(cycle) = crate::after::find_cycle(jobs.len(), |i| &edges[i]) {
        let names: Vec<String> = cycle.iter().map(|i| format!("jobs[{i}]")).collect();
        return Err(Error::invalid(
            "after",
            format!(
                "a cycle: {} runs after {}",
                names.join(" runs after "),
                names[0]
            ),
        ));
    }
    Ok(())
}

fn describe(dep: crate::After) -> String {
    match dep {
        crate::After::Job(id) => format!("job {id}"),
        crate::After::Call(i) => format!("jobs[{i}]"),
    }
}

/// Checks the `limit` of a listing (1..=1000).
///
/// # Errors
/// [`Error::InvalidInput`] on `limit`.
pub fn list_limit(limit: u32) -> Result<()> {
    if !(1..=1000).contains(&limit) {
        return Err(Error::invalid(
            "limit",
            format!("must be 1..=1000, got {limit}"),
        ));
    }
    Ok(())
}

/// Checks the ids one call acts on: 1 to 1000.
///
/// # Errors
/// [`Error::InvalidInput`] on `ids`.
pub fn job_ids(ids: &[crate::JobId]) -> Result<()> {
    if ids.is_empty() || ids.len() > 1000 {
        return Err(Error::invalid(
            "ids",
            format!("must name 1 to 1000 jobs, got {}", ids.len()),
        ));
    }
    Ok(())
}

/// Checks a lease length or heartbeat extension.
///
/// # Errors
/// [`Error::InvalidInput`] on `field`.
pub fn lease_length(field: &'static str, d: Duration) -> Result<()> {
    if d < Duration::from_millis(1) || d > MAX_LEASE {
        return Err(Error::invalid(
            field,
            format!("must be 1 ms to 7 days, got {d:?}"),
        ));
    }
    Ok(())
}

/// Checks a claim request (SPEC C1).
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bad field.
pub fn claim(req: &ClaimRequest) -> Result<()> {
    queue_name(&req.queue)?;
    label("worker", &req.worker)?;
    if !(1..=MAX_CLAIM_LIMIT).contains(&req.limit) {
        return Err(Error::invalid(
            "limit",
            format!("must be 1..={MAX_CLAIM_LIMIT}, got {}", req.limit),
        ));
    }
    lease_length("lease", req.lease)
}

/// Checks a failure's retry: a delay of at most 100 years, a time between 1970 and 9999.
///
/// # Errors
/// [`Error::InvalidInput`] on field `retry`.
pub fn retry(retry: Retry) -> Result<()> {
    match retry {
        Retry::After(d) => delay("retry", d),
        Retry::At(t) => instant("retry", t),
        Retry::Backoff | Retry::Never => Ok(()),
    }
}

/// Checks a settle call and cleans each failure's error text (see
/// [`clean_error_text`](crate::settle::clean_error_text)).
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bad field; nothing is settled then.
pub fn settles(settles: &mut [Settle]) -> Result<()> {
    if settles.len() > MAX_SETTLE {
        return Err(Error::invalid(
            "settles",
            format!("at most {MAX_SETTLE} per call, got {}", settles.len()),
        ));
    }
    for s in settles {
        queue_name(&s.lease.queue)?;
        if let Some(output) = &mut s.output {
            // A success's output is its result, kept whole or refused (SPEC L8), as
            // stored (a NUL, which PostgreSQL cannot store, becomes U+FFFD); a
            // failure's is a diagnostic, cut to its first 64 KiB.
            if s.outcome == Outcome::Complete {
                let stored = output.replace('\0', "\u{FFFD}");
                if stored.len() > MAX_RESULT_BYTES {
                    return Err(Error::invalid(
                        "output",
                        format!(
                            "a result is at most {MAX_RESULT_BYTES} bytes, got {}",
                            stored.len()
                        ),
                    ));
                }
                *output = stored;
            } else {
                *output = crate::settle::clean_error_text(output);
            }
        }
        if let Outcome::Fail { error, retry } = &mut s.outcome {
            *error = crate::settle::clean_error_text(error);
            self::retry(*retry)?;
        }
        // A wait past any date a backend stores would overflow its start (SPEC L5).
        if let Some(waited) = s.waited {
            delay("waited", waited)?;
        }
    }
    Ok(())
}

/// Checks a [`lost_leases`](crate::Complete::lost_leases) call: at most
/// [`MAX_SETTLE`] leases, each of a valid queue.
///
/// # Errors
/// [`Error::InvalidInput`] naming `leases` or the bad queue.
pub fn leases(leases: &[crate::Lease]) -> Result<()> {
    if leases.len() > MAX_SETTLE {
        return Err(Error::invalid(
            "leases",
            format!("at most {MAX_SETTLE} per call, got {}", leases.len()),
        ));
    }
    leases.iter().try_for_each(|l| queue_name(&l.queue))
}

/// Checks one progress report's fields: percent at most 100, message at most
/// [`MAX_PROGRESS_MESSAGE`] bytes.
///
/// # Errors
/// [`Error::InvalidInput`] on `percent` or `message`.
pub fn progress_fields(percent: u8, message: &str) -> Result<()> {
    if percent > 100 {
        return Err(Error::invalid(
            "percent",
            format!("must be 0 to 100, got {percent}"),
        ));
    }
    if message.len() > MAX_PROGRESS_MESSAGE {
        return Err(Error::invalid(
            "message",
            format!(
                "at most {MAX_PROGRESS_MESSAGE} bytes, got {}",
                message.len()
            ),
        ));
    }
    Ok(())
}

/// Checks a [`report_progress`](crate::Complete::report_progress) call: at most
/// [`MAX_SETTLE`] reports, each of a valid queue, each job once, percent at most 100,
/// message at most [`MAX_PROGRESS_MESSAGE`] bytes.
///
/// # Errors
/// [`Error::InvalidInput`] naming `reports`, the bad queue, `percent` or `message`.
pub fn progress(reports: &[ProgressReport]) -> Result<()> {
    if reports.len() > MAX_SETTLE {
        return Err(Error::invalid(
            "reports",
            format!("at most {MAX_SETTLE} per call, got {}", reports.len()),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(reports.len());
    for r in reports {
        queue_name(&r.lease.queue)?;
        progress_fields(r.percent, &r.message)?;
        if !seen.insert((r.lease.queue.as_str(), r.lease.job)) {
            return Err(Error::invalid(
                "reports",
                format!("job {} is reported twice in one call", r.lease.job),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for ok in ["relayq", "a", "_x", "app_2", &"a".repeat(48)] {
            assert!(schema_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "a-b",
            "a.b",
            "a\"b",
            "a]b",
            "a'b",
            "a b",
            &"a".repeat(49),
        ] {
            let err = schema_name(bad).unwrap_err();
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

    /// SPEC K1: a limit key is a label, and a backend that does not keep limit keys
    /// refuses a job with one, naming the field.
    #[test]
    fn limit_keys_are_labels_kept_only_where_the_backend_keeps_them() {
        let keeps = Limits {
            limit_keys: true,
            ..Limits::default()
        };
        let job = NewJob::new("q", vec![]).limit_key("db-a");
        assert!(new_job(&job, &keeps).is_ok());
        let refused = new_job(&job, &Limits::default()).unwrap_err();
        assert_eq!(refused.invalid_field(), Some("limit_key"), "{refused}");
        let bad = NewJob::new("q", vec![]).limit_key("a\nb");
        assert_eq!(
            new_job(&bad, &keeps).unwrap_err().invalid_field(),
            Some("limit_key")
        );
        assert_eq!(
            key_limit(Some(0)).unwrap_err().invalid_field(),
            Some("key_limit")
        );
        assert!(key_limit(None).is_ok() && key_limit(Some(1)).is_ok());
    }

    /// SPEC K8: a backend without rates refuses one on `rate` (SQL Server's path, whose
    /// server tests cannot run everywhere), and a lift passes.
    #[test]
    fn rates_are_refused_where_the_backend_keeps_none() {
        let rate = crate::Rate::new(5, Duration::from_secs(1));
        let set = crate::QueueUpdate::default().rate(Some(rate));
        let refused = rate_kept(&set, &Limits::default()).unwrap_err();
        assert_eq!(refused.invalid_field(), Some("rate"), "{refused}");
        let keeps = Limits {
            rates: true,
            ..Limits::default()
        };
        assert!(rate_kept(&set, &keeps).is_ok());
        let lift = crate::QueueUpdate::default().rate(None);
        assert!(rate_kept(&lift, &Limits::default()).is_ok());
    }

    #[test]
    fn queue_names() {
        assert!(queue_name("a").is_ok());
        assert!(queue_name("Az09_-.:").is_ok());
        assert!(queue_name(&"q".repeat(128)).is_ok());
        assert!(queue_name("a.b").is_ok());
        assert!(queue_name(".a").is_ok());
        for bad in [
            "",
            "a b",
            "a{b}",
            "é",
            "a\0",
            "'; DROP TABLE x;--",
            "]",
            ".",
            "..",
            "...",
        ] {
            assert_eq!(
                queue_name(bad).unwrap_err().invalid_field(),
                Some("queue"),
                "{bad:?}"
            );
        }
        assert!(queue_name(&"q".repeat(129)).is_err());
    }

    #[test]
    fn labels_keep_hostile_text_but_not_controls() {
        assert!(label("group", "'; DROP TABLE x;--").is_ok());
        assert!(label("group", "{a}]").is_ok());
        assert_eq!(
            label("group", "a\0b").unwrap_err().invalid_field(),
            Some("group")
        );
        assert!(label("group", &"x".repeat(10_000)).is_err());
        assert!(label("group", "").is_err());
    }

    fn deps(jobs: &[NewJob]) -> Result<()> {
        let keeps = Limits {
            dependencies: true,
            ..Limits::default()
        };
        new_jobs(jobs, &keeps)
    }

    fn in_batch(stage: i32) -> NewJob {
        NewJob::new("q", vec![]).in_batch(crate::BatchId(1), stage)
    }

    /// SPEC D1, D5: a graph of the call is accepted; every bad `after` is refused on
    /// `after`, naming the job.
    #[test]
    fn dependencies_are_checked_once_for_every_backend() {
        let good = [
            in_batch(0),
            in_batch(0),
            in_batch(1).after_call(0).after_call(1),
            in_batch(1).after_call(2).after(crate::JobId(7)),
        ];
        deps(&good).unwrap();
        let refused = new_jobs(&good, &Limits::default()).unwrap_err();
        assert_eq!(refused.invalid_field(), Some("after"), "{refused}");
        let cases: Vec<(Vec<NewJob>, &str)> = vec![
            (
                vec![NewJob::new("q", vec![]).after(crate::JobId(1))],
                "need a batch",
            ),
            (
                vec![in_batch(0), in_batch(0).after_call(5)],
                "jobs[1] runs after jobs[5]",
            ),
            (vec![in_batch(0).after_call(0)], "itself"),
            (vec![in_batch(0).after_call(0), in_batch(0)], "itself"),
            (
                vec![in_batch(1), in_batch(0).after_call(0)],
                "above its own stage",
            ),
            (
                vec![
                    NewJob::new("q", vec![]).in_batch(crate::BatchId(2), 0),
                    in_batch(0).after_call(0),
                ],
                "not in its batch",
            ),
            (
                vec![in_batch(0).dedupe_key("d"), in_batch(0).after_call(0)],
                "dedupe key",
            ),
            (
                vec![in_batch(0), in_batch(0).after_call(0).after_call(0)],
                "twice",
            ),
        ];
        for (jobs, says) in cases {
            let err = deps(&jobs).unwrap_err();
            assert_eq!(err.invalid_field(), Some("after"), "{err}");
            assert!(err.to_string().contains(says), "{err} should say {says:?}");
        }
    }

    /// SPEC D5: a cycle is refused, naming its jobs in order.
    #[test]
    fn a_cycle_is_refused_naming_its_jobs() {
        let jobs = [
            in_batch(0),
            in_batch(0).after_call(3),
            in_batch(0).after_call(1).after_call(0),
            in_batch(0).after_call(2),
        ];
        let err = deps(&jobs).unwrap_err();
        assert_eq!(err.invalid_field(), Some("after"));
        let text = err.to_string();
        // 1 after 3, 3 after 2, 2 after 1: any rotation of that order.
        assert!(
            [
                "jobs[1] runs after jobs[3] runs after jobs[2] runs after jobs[1]",
                "jobs[3] runs after jobs[2] runs after jobs[1] runs after jobs[3]",
                "jobs[2] runs after jobs[1] runs after jobs[3] runs after jobs[2]",
            ]
            .iter()
            .any(|c| text.contains(c)),
            "{text}"
        );
    }

    #[test]
    fn jobs_of_one_call_share_a_queue() {
        let jobs = [NewJob::new("a", vec![]), NewJob::new("b", vec![])];
        let err = new_jobs(&jobs, &Limits::default()).unwrap_err();
        assert_eq!(err.invalid_field(), Some("queue"));
    }
}
