//! [`claim_refilling`]: the tail every SQL claim shares. A claim statement may meet
//! jobs whose lease ran out with no attempts left; those must die first (SPEC C5),
//! which may release their group or stage, and then the rest of the limit is filled.

use std::future::Future;

use crate::{ClaimedJob, Result};

/// Claims up to `limit` jobs with `claim(room)`, which returns what it claimed and
/// whether it met doomed jobs; if it did, runs `expire` and claims again for the room
/// left. The jobs come back sorted by order key (SPEC C3), whatever order the
/// statements returned them in.
///
/// # Errors
/// The first error of `claim` or `expire`.
pub async fn claim_refilling<C, CFut, X, XFut>(
    limit: u32,
    mut claim: C,
    expire: X,
) -> Result<Vec<ClaimedJob>>
where
    C: FnMut(u32) -> CFut,
    CFut: Future<Output = Result<(Vec<ClaimedJob>, bool)>>,
    X: FnOnce() -> XFut,
    XFut: Future<Output = Result<()>>,
{
    let (mut jobs, doomed) = claim(limit).await?;
    if doomed {
        expire().await?;
        let room = limit.saturating_sub(u32::try_from(jobs.len()).unwrap_or(limit));
        if room > 0 {
            jobs.extend(claim(room).await?.0);
        }
    }
    jobs.sort_unstable_by_key(|j| (j.priority, j.run_at, j.lease.job));
    Ok(jobs)
}
