//! Checking a schedule before it is stored (SPEC S6).

use chrono::Utc;

use super::{MAX_CATCH_UP, MAX_DEFINITION, MAX_NAME, MAX_SLOT_JOBS, Missed, Schedule, Timetable};
use crate::{Error, Limits, Result, validate};

/// Checks a schedule's name: 1 to 128 bytes, no control characters.
///
/// # Errors
/// [`Error::InvalidInput`] on `name`.
pub fn schedule_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(Error::invalid(
            "name",
            format!("must be 1 to {MAX_NAME} bytes, got {}", name.len()),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "name",
            "must not contain control characters (NUL, newline, ...)",
        ));
    }
    Ok(())
}

/// Checks a schedule (SPEC S6) and returns its definition as the JSON text backends
/// store.
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bad field: `queue`, `name`, `cron`,
/// `time_zone`, `missed`, `jobs`, `starting`, or a job's own field.
pub fn schedule(s: &Schedule, limits: &Limits) -> Result<String> {
    validate::queue_name(&s.queue)?;
    schedule_name(&s.name)?;
    if let Some(t) = s.starting {
        validate::instant("starting", t)?;
    }
    let d = &s.definition;
    let table = Timetable::new(&d.cron, &d.time_zone)?;
    if table
        .next_after(s.starting.unwrap_or_else(Utc::now))
        .is_none()
    {
        return Err(Error::invalid(
            "cron",
            format!("{:?} has no slot after the schedule starts", d.cron),
        ));
    }
    if let Missed::All { within_secs } = d.missed
        && !(1..=MAX_CATCH_UP.as_secs()).contains(&within_secs)
    {
        return Err(Error::invalid(
            "missed",
            format!(
                "the catch-up window must be 1 s to {} days, got {within_secs} s",
                MAX_CATCH_UP.as_secs() / 86_400
            ),
        ));
    }
    if d.jobs.is_empty() || d.jobs.len() > MAX_SLOT_JOBS {
        return Err(Error::invalid(
            "jobs",
            format!(
                "a slot enqueues 1 to {MAX_SLOT_JOBS} jobs, got {}",
                d.jobs.len()
            ),
        ));
    }
    for job in &d.jobs {
        if d.batch.is_none() && job.stage.is_some() {
            return Err(Error::invalid(
                "stage",
                "a stage needs a schedule that makes a batch",
            ));
        }
        let mut new = job.to_new_job(&s.queue, &s.name, d.batch.is_some());
        // Stands in for the batch each slot opens, so the stage rule holds.
        new.batch = d.batch.map(|_| crate::BatchId(0));
        validate::new_job(&new, limits)?;
    }
    let text = serde_json::to_string(d).map_err(|e| Error::invalid("definition", e.to_string()))?;
    if text.len() > MAX_DEFINITION {
        return Err(Error::invalid(
            "jobs",
            format!(
                "the schedule's jobs take {} bytes stored, more than {MAX_DEFINITION}",
                text.len()
            ),
        ));
    }
    Ok(text)
}
