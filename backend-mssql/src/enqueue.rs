//! SPEC E: storing jobs, all of one call in one batch (see [`sql::ENQUEUE`]).

use std::collections::HashMap;

use async_trait::async_trait;
use relayq_core::{
    Enqueue, Enqueued, Error, JobId, Limits, NewJob, Result, RunAt, retry::retry_transient,
};
use serde_json::{Value, json};
use tiberius::Row;

use crate::{
    MssqlBackend, keys,
    rows::{self, req},
    sql,
};

/// The jobs as the JSON document [`sql::ENQUEUE`] reads. Relative times go as
/// (days, ms) and resolve against the server's clock.
pub(crate) fn jobs_json(jobs: &[NewJob]) -> Result<String> {
    let mut items = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let (at, delay) = match job.run_at {
            RunAt::Now => (None, None),
            RunAt::After(d) => (None, Some(rows::split(d))),
            RunAt::At(t) => (Some(rows::iso(t)), None),
        };
        items.push(json!({
            "ord": i,
            "payload": rows::hex(&job.payload),
            "priority": job.priority,
            "at": at,
            "days": delay.map(|d| d.0),
            "ms": delay.map(|d| d.1),
            "max_attempts": i16::try_from(job.max_attempts).map_err(Error::backend)?,
            "group": job.group.as_deref().map(keys::store),
            "batch": job.batch.map(|b| b.0),
            "stage": job.batch.map(|_| job.stage.unwrap_or(0)),
            "dedupe": job.dedupe_key.as_deref().map(keys::store),
            "who": job.enqueued_by,
        }));
    }
    Ok(Value::Array(items).to_string())
}

/// The error for the first job that failed its batch's check.
pub(crate) fn batch_error(jobs: &[NewJob], r: &Row) -> Result<Error> {
    let at: usize = rows::num(req::<i32>(r, 0)?)?;
    let batch = jobs
        .get(at)
        .and_then(|j| j.batch)
        .ok_or_else(|| Error::backend("batch check named an unknown job"))?;
    Ok(match req::<&str>(r, 1)? {
        "sealed" => Error::invalid("batch", format!("batch {batch} is sealed")),
        "halted" => Error::invalid("batch", format!("batch {batch} halted after a dead job")),
        "closed" => Error::StageClosed {
            stage: req(r, 2)?,
            released: req(r, 3)?,
        },
        _ => Error::invalid("batch", format!("batch {batch} is unknown in this queue")),
    })
}

/// Each job's id: its own (ids increase in input order), or, when deduplicated, the
/// holder's. `inserted` are the new ids in ascending order; `holders` map stored dedupe
/// keys to the live job holding them after the insert.
pub(crate) fn assign(
    jobs: &[NewJob],
    inserted: &[i64],
    holders: &HashMap<String, i64>,
) -> Result<Vec<Enqueued>> {
    let mut new_ids = inserted.iter().copied();
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let Some(key) = job.dedupe_key.as_deref().map(keys::store) else {
            let id = new_ids.next().ok_or_else(short)?;
            out.push(Enqueued {
                id: JobId(id),
                deduplicated: false,
            });
            continue;
        };
        let holder = *holders
            .get(&key)
            .ok_or_else(|| Error::backend("a dedupe key has no live holder after the insert"))?;
        // The job of this call that was inserted is the holder; ids of inserted jobs
        // come in input order, so the holder is the next new id exactly when it is new.
        let fresh = inserted.contains(&holder) && out.iter().all(|e: &Enqueued| e.id.0 != holder);
        if fresh {
            new_ids.next();
        }
        out.push(Enqueued {
            id: JobId(holder),
            deduplicated: !fresh,
        });
    }
    Ok(out)
}

fn short() -> Error {
    Error::backend("insert returned fewer ids than jobs")
}

impl MssqlBackend {
    async fn enqueue_batch(&self, jobs: &[NewJob], doc: &str) -> Result<Vec<Enqueued>> {
        let queue = jobs[0].queue.as_str();
        let sets = self.run_once(sql::ENQUEUE, &[&queue, &doc]).await?;
        let status = rows::set(&sets, 0)?
            .first()
            .ok_or_else(|| Error::backend("enqueue returned no status"))?;
        if rows::get::<i32>(status, 0)?.is_some() {
            return Err(batch_error(jobs, status)?);
        }
        let inserted = rows::set(&sets, 1)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect::<Result<Vec<_>>>()?;
        let holders = rows::set(&sets, 2)?
            .iter()
            .map(|r| Ok((req::<&str>(r, 0)?.to_owned(), req::<i64>(r, 1)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        let out = assign(jobs, &inserted, &holders)?;
        self.wake(rows::set(&sets, 3)?)?;
        Ok(out)
    }
}

#[async_trait]
impl Enqueue for MssqlBackend {
    fn limits(&self) -> Limits {
        // Limit keys are not kept here yet (SPEC K1), whatever the configuration says.
        Limits {
            limit_keys: false,
            rates: false,
            ..self.inner.limits
        }
    }

    async fn enqueue_unchecked(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let doc = jobs_json(&jobs)?;
        retry_transient(|| self.enqueue_batch(&jobs, &doc), crate::error::retryable).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn job(key: Option<&str>) -> NewJob {
        let mut j = NewJob::new("q", b"\x00\xff".to_vec());
        j.dedupe_key = key.map(str::to_owned);
        j
    }

    #[test]
    fn ids_follow_input_order_and_dedupe_points_at_the_holder() {
        let jobs = vec![
            job(None),
            job(Some("k")),
            job(Some("k")),
            job(None),
            job(Some("old")),
        ];
        let holders = HashMap::from([(keys::store("k"), 11), (keys::store("old"), 3)]);
        let out = assign(&jobs, &[10, 11, 12], &holders).unwrap();
        let ids: Vec<(i64, bool)> = out.iter().map(|e| (e.id.0, e.deduplicated)).collect();
        assert_eq!(
            ids,
            [(10, false), (11, false), (11, true), (12, false), (3, true)]
        );
    }

    #[test]
    fn missing_ids_are_an_error_not_a_guess() {
        let jobs = vec![job(None), job(None)];
        assert!(assign(&jobs, &[1], &HashMap::new()).is_err());
        assert!(assign(&[job(Some("k"))], &[], &HashMap::new()).is_err());
    }

    #[test]
    fn jobs_bind_as_one_json_document() {
        let mut j = job(Some("a "));
        j.group = Some("g".into());
        j.run_at = RunAt::After(Duration::from_secs(2 * 86_400 + 1));
        let v: Value = serde_json::from_str(&jobs_json(&[j]).unwrap()).unwrap();
        assert_eq!(v[0]["payload"], "00FF");
        assert_eq!(v[0]["dedupe"], "a #");
        assert_eq!(v[0]["group"], "g#");
        assert_eq!(v[0]["days"], 2);
        assert_eq!(v[0]["ms"], 1000);
        assert!(v[0]["batch"].is_null() && v[0]["stage"].is_null());
    }
}
