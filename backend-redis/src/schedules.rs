//! SPEC S: schedules, in the queue's hash slot. A slot fires in one script that moves
//! the mark and stores the slot's jobs (`lua/fire.lua`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::Value;
use relayq_core::{
    BatchId, Enqueued, Error, EventKind, JobId, Result, Schedules,
    schedule::{Fire, Fired, StoredSchedule},
};

use crate::{
    RedisBackend, arg,
    jobs::push_job,
    reply::{self, bad, int, opt_text, text, time},
    scripts,
};

/// Fields per schedule in the listing's reply, after its name.
const LISTED: usize = 8;

fn opt_int(v: &Value) -> Result<Option<i64>> {
    opt_text(v)?
        .map(|t| t.parse().map_err(Error::backend))
        .transpose()
}

#[async_trait]
impl Schedules for RedisBackend {
    async fn put_schedule_unchecked(
        &self,
        queue: &str,
        name: &str,
        definition: &str,
        starting: Option<DateTime<Utc>>,
    ) -> Result<()> {
        self.register(queue).await?;
        let args = [
            b"put".to_vec(),
            name.as_bytes().to_vec(),
            definition.as_bytes().to_vec(),
            starting
                .map(|t| t.timestamp_micros().to_string())
                .unwrap_or_default()
                .into_bytes(),
        ];
        let _: i64 = self.run(&scripts::SCHEDULE, queue, &args).await?;
        Ok(())
    }

    async fn stored_schedules_unchecked(
        &self,
        queue: &str,
    ) -> Result<(Vec<StoredSchedule>, DateTime<Utc>)> {
        let out: Value = self
            .run(&scripts::SCHEDULE_READ, queue, &[b"list".to_vec()])
            .await?;
        let items = reply::items(out)?;
        let (now, rest) = items.split_first().ok_or_else(|| bad("schedules"))?;
        let mut rows = rest
            .chunks(LISTED)
            .map(|r| {
                if r.len() != LISTED {
                    return Err(bad("schedules"));
                }
                Ok(StoredSchedule {
                    name: text(&r[0])?,
                    definition: text(&r[1])?,
                    version: int(&r[2])?,
                    mark: time(int(&r[3])?),
                    paused: text(&r[4])? == "1",
                    last_slot: opt_int(&r[5])?.map(time),
                    last_job: opt_int(&r[6])?.map(JobId),
                    last_batch: opt_int(&r[7])?.map(BatchId),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((rows, time(int(now)?)))
    }

    async fn delete_schedule_unchecked(&self, queue: &str, name: &str) -> Result<bool> {
        let args = [b"delete".to_vec(), name.as_bytes().to_vec()];
        let n: i64 = self.run(&scripts::SCHEDULE, queue, &args).await?;
        Ok(n > 0)
    }

    async fn pause_schedule_unchecked(&self, queue: &str, name: &str, paused: bool) -> Result<()> {
        let args = [
            b"pause".to_vec(),
            name.as_bytes().to_vec(),
            arg(u8::from(paused)),
        ];
        let n: i64 = self.run(&scripts::SCHEDULE, queue, &args).await?;
        if n < 0 {
            return Err(Error::not_found(format!(
                "schedule {name:?} in queue {queue:?}"
            )));
        }
        Ok(())
    }

    async fn fire_unchecked(&self, fire: Fire) -> Result<Fired> {
        let mut args = Vec::with_capacity(5 + fire.jobs.len() * 11);
        args.push(fire.name.as_bytes().to_vec());
        args.push(arg(fire.version));
        args.push(
            fire.slot
                .map(|t| t.timestamp_micros().to_string())
                .unwrap_or_default()
                .into_bytes(),
        );
        args.push(
            fire.batch
                .map(|b| b.as_str().to_owned())
                .unwrap_or_default()
                .into_bytes(),
        );
        args.push(arg(fire.jobs.len()));
        for job in &fire.jobs {
            push_job(&mut args, job);
        }
        let out: Value = self.run(&scripts::FIRE, &fire.queue, &args).await?;
        let items = reply::items(out)?;
        let why = text(items.first().ok_or_else(|| bad("fire"))?)?;
        let fired = match why.as_str() {
            "made" => {
                let batch = opt_int(items.get(1).ok_or_else(|| bad("fire"))?)?.map(BatchId);
                let jobs = items[2..]
                    .chunks(2)
                    .map(|pair| {
                        Ok(Enqueued {
                            id: JobId(int(&pair[0])?),
                            deduplicated: int(pair.get(1).ok_or_else(|| bad("fire"))?)? == 1,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Fired::Made { batch, jobs }
            }
            "gone" => Fired::Gone,
            "changed" => Fired::Changed,
            "paused" => Fired::Paused,
            "taken" => Fired::Taken,
            "notdue" => Fired::NotDue,
            _ => return Err(bad("fire")),
        };
        if let Fired::Made { batch, jobs } = &fired
            && !jobs.is_empty()
        {
            self.notify_local(&fire.queue, EventKind::Ready);
            if batch.is_some() {
                self.notify_local(&fire.queue, EventKind::Finished);
            }
        }
        Ok(fired)
    }
}
