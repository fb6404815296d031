//! SPEC C: claims in one statement (see [`sql::CLAIM`]).

use async_trait::async_trait;
use relayq_core::{BatchId, Claim, ClaimRequest, ClaimedJob, JobId, Lease, LeaseToken, Result};
use tiberius::Row;

use crate::{
    MAX_CLAIM, MssqlBackend, keys,
    rows::{self, num, req},
    sql,
};

fn to_job(req_: &ClaimRequest, r: &Row) -> Result<ClaimedJob> {
    Ok(ClaimedJob {
        lease: Lease {
            queue: req_.queue.clone(),
            job: JobId(req(r, 0)?),
            token: LeaseToken(req(r, 1)?),
            attempt: num(req::<i16>(r, 2)?)?,
            expires_at: rows::time(r, 11)?,
            worker: req_.worker.clone(),
        },
        payload: req::<&[u8]>(r, 3)?.to_vec(),
        priority: req(r, 4)?,
        run_at: rows::time(r, 5)?,
        max_attempts: num(req::<i16>(r, 6)?)?,
        group: rows::get::<&str>(r, 7)?.map(keys::load),
        batch: rows::get(r, 8)?.map(BatchId),
        stage: rows::get(r, 9)?,
        enqueued_by: rows::text(r, 10)?,
    })
}

impl MssqlBackend {
    /// One claim batch: the jobs, and whether expired jobs wait to be made dead.
    async fn claim_up_to(
        &self,
        req_: &ClaimRequest,
        limit: i32,
    ) -> Result<(Vec<ClaimedJob>, bool)> {
        let lease = rows::millis(req_.lease);
        let sets = self
            .run(
                sql::CLAIM,
                &[&req_.queue.as_str(), &limit, &lease, &req_.worker.as_str()],
            )
            .await?;
        let jobs = rows::set(&sets, 0)?
            .iter()
            .map(|r| to_job(req_, r))
            .collect::<Result<Vec<_>>>()?;
        let doomed = rows::set(&sets, 1)?
            .first()
            .map(|r| req::<i32>(r, 0))
            .transpose()?
            .is_some_and(|d| d == 1);
        Ok((jobs, doomed))
    }
}

#[async_trait]
impl Claim for MssqlBackend {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        relayq_core::kit::claim_refilling(
            req.limit.min(MAX_CLAIM),
            |room| self.claim_up_to(&req, i32::try_from(room).unwrap_or(1)),
            || async { self.expire(&req.queue, false).await.map(drop) },
        )
        .await
    }
}
