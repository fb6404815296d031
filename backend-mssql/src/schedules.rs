//! SPEC S: schedules. A slot fires in one batch and one transaction
//! ([`sql::FIRE`]): the schedule's row locked (skipped when another scheduler holds
//! it), its mark moved, and the slot's jobs stored.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use relayq_core::{
    BatchId, Error, JobId, Result, Schedules,
    retry::retry_transient,
    schedule::{Fire, Fired, StoredSchedule},
};

use crate::{
    MssqlBackend,
    enqueue::{assign, batch_error, jobs_json},
    keys,
    rows::{self, get, req, time, time_opt},
    sql,
};

impl MssqlBackend {
    async fn fire_once(&self, fire: &Fire, doc: &str) -> Result<Fired> {
        let name = keys::store(&fire.name);
        let slot: Option<NaiveDateTime> = fire.slot.map(|t| t.naive_utc());
        let on_failure: Option<&str> = fire.batch.map(relayq_core::OnFailure::as_str);
        let sets = self
            .run_once(
                sql::FIRE.as_str(),
                &[
                    &fire.queue.as_str(),
                    &doc,
                    &name.as_str(),
                    &fire.version,
                    &slot,
                    &on_failure,
                    &fire.name.as_str(),
                ],
            )
            .await?;
        let verdict = rows::set(&sets, 0)?
            .first()
            .ok_or_else(|| Error::backend("fire returned no verdict"))?;
        if let Some(why) = get::<&str>(verdict, 0)? {
            return Ok(match why {
                "busy" => Fired::Busy,
                "gone" => Fired::Gone,
                "changed" => Fired::Changed,
                "paused" => Fired::Paused,
                "taken" => Fired::Taken,
                "notdue" => Fired::NotDue,
                other => return Err(Error::backend(format!("fire said {other:?}"))),
            });
        }
        let batch = get::<i64>(verdict, 1)?.map(BatchId);
        // The enqueue's own checks, which core's validation should leave nothing to.
        let status = rows::set(&sets, 1)?
            .first()
            .ok_or_else(|| Error::backend("fire returned no enqueue status"))?;
        if get::<i32>(status, 0)?.is_some() {
            return Err(batch_error(&fire.jobs, status)?);
        }
        let inserted = rows::set(&sets, 2)?
            .iter()
            .map(|r| req::<i64>(r, 0))
            .collect::<Result<Vec<_>>>()?;
        let holders = rows::set(&sets, 3)?
            .iter()
            .map(|r| Ok((req::<&str>(r, 0)?.to_owned(), req::<i64>(r, 1)?)))
            .collect::<Result<std::collections::HashMap<_, _>>>()?;
        let jobs = assign(&fire.jobs, &inserted, &holders)?;
        self.wake(rows::set(&sets, 4)?)?;
        Ok(Fired::Made { batch, jobs })
    }
}

#[async_trait]
impl Schedules for MssqlBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let name = keys::store(name);
        let starting: Option<NaiveDateTime> = starting.map(|t| t.naive_utc());
        self.run(
            sql::SCHEDULE_PUT,
            &[&queue, &name.as_str(), &definition, &starting],
        )
        .await?;
        Ok(())
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        let sets = self.run(sql::SCHEDULE_LIST, &[&queue]).await?;
        let list = rows::set(&sets, 0)?
            .iter()
            .map(|r| {
                Ok(StoredSchedule {
                    name: keys::load(req::<&str>(r, 0)?),
                    definition: req::<&str>(r, 1)?.to_owned(),
                    version: req::<i64>(r, 2)?,
                    mark: time(r, 3)?,
                    paused: req::<bool>(r, 4)?,
                    last_slot: time_opt(r, 5)?,
                    last_job: get::<i64>(r, 6)?.map(JobId),
                    last_batch: get::<i64>(r, 7)?.map(BatchId),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let now = rows::set(&sets, 1)?
            .first()
            .ok_or_else(|| Error::backend("no server time"))?;
        Ok((list, time(now, 0)?))
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        let name = keys::store(name);
        let sets = self
            .run(sql::SCHEDULE_DELETE, &[&queue, &name.as_str()])
            .await?;
        Ok(count(&sets)? > 0)
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        let key = keys::store(name);
        let sets = self
            .run(sql::SCHEDULE_PAUSE, &[&queue, &key.as_str(), &paused])
            .await?;
        if count(&sets)? == 0 {
            return Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            )));
        }
        Ok(())
    }

    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired> {
        let doc = jobs_json(&fire.jobs)?;
        retry_transient(|| self.fire_once(&fire, &doc), crate::error::retryable).await
    }
}

fn count(sets: &[Vec<tiberius::Row>]) -> Result<i64> {
    let row = rows::set(sets, 0)?
        .first()
        .ok_or_else(|| Error::backend("no row count"))?;
    Ok(i64::from(req::<i32>(row, 0)?))
}
