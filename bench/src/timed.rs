//! A backend that times its claims, for the phase scenario: every other call passes
//! through untouched.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use relayq::{Backend, Claim, ClaimRequest, ClaimedJob, Result, async_trait};

pub struct Timed {
    inner: Arc<dyn Backend>,
    claims: Mutex<Vec<Duration>>,
}

impl Timed {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            claims: Mutex::new(Vec::new()),
        }
    }

    /// The claim times since the last call.
    pub fn take(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.claims.lock().expect("not poisoned"))
    }
}

relayq::delegate!(Timed, inner => Events, Enqueue, Complete, OrderBarrier, Inspect, Admin, Schedules);

#[async_trait]
impl Claim for Timed {
    async fn claim_unchecked(&self, req: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim_paced_unchecked(req).await?.jobs)
    }

    async fn claim_paced_unchecked(&self, req: ClaimRequest) -> Result<relayq::Claimed> {
        let start = Instant::now();
        let out = self.inner.claim_paced_unchecked(req).await;
        self.claims
            .lock()
            .expect("not poisoned")
            .push(start.elapsed());
        out
    }
}
