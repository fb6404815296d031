//! SPEC L: settling leases, many in one batch, each fenced by its own token.

use std::{collections::HashSet, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use relayq_core::{
    Complete, Error, JobId, JobState, Lease, Outcome, ProgressReport, Result, Retry, Settle,
    Settled, retry::retry_transient,
};
use serde_json::{Value, json};

use crate::{
    MssqlBackend,
    rows::{self, req},
    sql,
};

/// The settles as the JSON document [`sql::SETTLE`] reads; each element carries its
/// input position. A lease given twice in one call counts once (the first), the others
/// are stale, as if they came one after another.
pub(crate) fn settle_json(settles: &[Settle]) -> String {
    let mut seen = HashSet::new();
    let mut items = Vec::with_capacity(settles.len());
    for (i, s) in settles.iter().enumerate() {
        if !seen.insert((s.lease.job, s.lease.token)) {
            continue;
        }
        let (kind, error, delay, at) = match &s.outcome {
            Outcome::Complete => ("complete", None, None, None),
            Outcome::Release => ("release", None, None, None),
            Outcome::Fail { error, retry } => {
                let (delay, at) = match *retry {
                    // Resolved against the server's clock by the batch.
                    Retry::At(t) => (None, Some(rows::iso(t))),
                    Retry::Never => (None, None),
                    r => (r.delay(s.lease.attempt, Utc::now()).map(rows::split), None),
                };
                ("fail", Some(error.as_str()), delay, at)
            }
        };
        items.push(json!({
            "ord": i,
            "id": s.lease.job.0,
            "token": s.lease.token.0.to_string(),
            "queue": s.lease.queue,
            "kind": kind,
            "days": delay.map(|d| d.0),
            "ms": delay.map(|d| d.1),
            "at": at,
            "error": error,
            "output": s.output,
            "wait_ms": i32::try_from(s.waited_micros() / 1000).unwrap_or(i32::MAX),
        }));
    }
    Value::Array(items).to_string()
}

impl MssqlBackend {
    async fn settle_batch(&self, settles: &[Settle]) -> Result<Vec<Result<Settled>>> {
        let doc = settle_json(settles);
        let sets = self.run_once(sql::SETTLE, &[&doc.as_str()]).await?;
        let mut out: Vec<Result<Settled>> =
            settles.iter().map(|_| Err(Error::StaleLease)).collect();
        for r in rows::set(&sets, 0)? {
            let at: usize = rows::num(req::<i32>(r, 0)?)?;
            let next: JobState = req::<&str>(r, 1)?.parse()?;
            let slot = out
                .get_mut(at)
                .ok_or_else(|| Error::backend("settle returned an unknown position"))?;
            *slot = Ok(match next {
                JobState::Succeeded => Settled::Completed,
                JobState::Dead => Settled::Dead,
                JobState::Retrying => Settled::Retrying {
                    at: rows::time(r, 2)?,
                },
                _ => Settled::Released,
            });
        }
        self.wake(rows::set(&sets, 1)?)?;
        Ok(out)
    }
}

// Keeps the default `preferred_settle_batch` (128), unlike PostgreSQL and SQLite (512):
// each call is a transaction with a commit here too, but no SQL Server was at hand to
// measure a larger one. The first worry about 512, lock escalation at 5,000 locks, no
// longer applies (migration 2 turns it off); a settle of 512 would still hold about as
// many locks as a claim of `MAX_CLAIM` rows.
#[async_trait]
impl Complete for MssqlBackend {
    async fn settle_many_unchecked(&self, settles: Vec<Settle>) -> Result<Vec<Result<Settled>>> {
        if settles.is_empty() {
            return Ok(Vec::new());
        }
        retry_transient(|| self.settle_batch(&settles), crate::error::retryable).await
    }

    async fn heartbeat_unchecked(&self, lease: &Lease, extend: Duration) -> Result<DateTime<Utc>> {
        let sets = self
            .run(
                sql::HEARTBEAT,
                &[
                    &lease.job.0,
                    &lease.token.0,
                    &lease.queue.as_str(),
                    &rows::millis(extend),
                ],
            )
            .await?;
        match rows::set(&sets, 0)?.first() {
            Some(r) => rows::time(r, 0),
            None => Err(Error::StaleLease),
        }
    }

    async fn lost_leases_unchecked(&self, leases: &[Lease]) -> Result<Vec<JobId>> {
        let doc: Vec<Value> = leases
            .iter()
            .map(|l| json!({"id": l.job.0, "token": l.token.0.to_string()}))
            .collect();
        let doc = Value::Array(doc).to_string();
        let sets = self.run(sql::LOST, &[&doc.as_str()]).await?;
        rows::set(&sets, 0)?
            .iter()
            .map(|r| req::<i64>(r, 0).map(JobId))
            .collect()
    }

    /// The reports go in id order, the order every writer locks job rows in.
    async fn worker_beat_unchecked(
        &self,
        queue: &str,
        beat: &relayq_core::WorkerBeat,
    ) -> Result<()> {
        self.beat(queue, beat).await
    }

    async fn report_progress_unchecked(&self, reports: &[ProgressReport]) -> Result<Vec<JobId>> {
        let mut reports: Vec<&ProgressReport> = reports.iter().collect();
        reports.sort_unstable_by_key(|r| r.lease.job);
        let doc: Vec<Value> = reports
            .iter()
            .map(|r| {
                let token = r.lease.token.0.to_string();
                json!({"id": r.lease.job.0, "token": token, "progress": r.stored()})
            })
            .collect();
        let doc = Value::Array(doc).to_string();
        let sets = self.run(sql::PROGRESS, &[&doc.as_str()]).await?;
        let written = rows::set(&sets, 0)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect::<Result<Vec<_>>>()?;
        Ok(reports
            .iter()
            .map(|r| r.lease.job)
            .filter(|id| !written.contains(&id.0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use relayq_core::{JobId, LeaseToken};

    use super::*;

    fn lease(id: i64) -> Lease {
        Lease {
            queue: "q".into(),
            job: JobId(id),
            token: LeaseToken(uuid::Uuid::new_v4()),
            attempt: 1,
            expires_at: Utc::now(),
            worker: "w".into(),
        }
    }

    #[test]
    fn settles_bind_as_one_json_document() {
        let l = lease(7);
        let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        let settles = vec![
            Settle::complete(l.clone()).with_output(Some("done".into())),
            // The same lease again: stale, so not sent.
            Settle::release(l.clone()),
            Settle::fail(lease(8), "boom", Retry::At(at)),
            Settle::fail(lease(9), "bad", Retry::Never),
            Settle::fail(
                lease(10),
                "later",
                Retry::After(Duration::from_secs(90_000)),
            ),
        ];
        let v: Value = serde_json::from_str(&settle_json(&settles)).unwrap();
        let items = v.as_array().unwrap();
        assert_eq!(items.len(), 4);
        assert_eq!(items[0]["ord"], 0);
        assert_eq!(items[0]["kind"], "complete");
        assert_eq!(items[0]["output"], "done");
        assert_eq!(items[0]["token"], l.token.0.to_string());
        assert_eq!(items[1]["ord"], 2);
        assert_eq!(items[1]["at"], "2030-01-02T03:04:05.000000");
        assert_eq!(items[1]["error"], "boom");
        assert!(items[2]["days"].is_null() && items[2]["at"].is_null());
        assert_eq!(items[3]["days"], 1);
        assert_eq!(items[3]["ms"], 3_600_000);
    }
}
