//! SPEC X3 under a real fault: a handle's connections are cut mid-operation, and every
//! job still ends where the rules allow (SPEC X3, X4, C2, E1, G2).

use std::{sync::Arc, time::Duration};

use anyhow::{bail, ensure};
use relayq_core::{Backend, ClaimRequest, CompleteExt, Error, JobState, Lease, NewJob, Settle};

use super::support::{PATIENCE, total};
use crate::{Env, poll_until, queue_name};

/// Jobs enqueued before the cuts, in this many groups: a settle that finished a job
/// but lost the promotion of its group's next one would leave that job blocked for ever.
const SEED: u64 = 120;
const GROUPS: u64 = 30;
/// Jobs per enqueue call made through the proxy.
const CALL: u64 = 20;
/// The lease of claims made through the proxy: a claim whose reply is lost leaves its
/// jobs running under a lease nobody knows, which must run out and let them go.
const CUT_LEASE: Duration = Duration::from_millis(500);

/// Enqueues, claims and settles through a handle whose connections a [`Proxy`] cuts
/// at a random moment of each call (SPEC X3). Afterwards:
/// - an enqueue call stored all of its jobs or none, and all when it said so (E1);
/// - every error was transient, so a caller knows it may try again (X4);
/// - every job can still be claimed and completed: none lost, none blocked for ever
///   behind a group whose promotion was lost (G2);
/// - no lease handed out through the proxy still holds a finished job: nothing held
///   twice (C2, L1).
///
/// [`Proxy`]: crate::Proxy
pub async fn x3_cut_connections_lose_nothing_and_hold_nothing_twice(
    env: &Env,
) -> anyhow::Result<()> {
    let Some(proxied) = env.proxied().await else {
        bail!("the subject declares ConnectionCut, but its Env has no with_proxy");
    };
    let (proxy, cut) = proxied?;
    let proxy = Arc::new(proxy);
    let direct = env.backend();
    let q = queue_name("x3cut");
    let seed = (0..SEED).map(|i| grouped(&q, i)).collect::<Vec<_>>();
    direct.enqueue(seed).await?;
    let mut queues = vec![(q.clone(), SEED)];
    let mut calls = Vec::new();
    let mut leases: Vec<Lease> = Vec::new();
    let mut unsettled: Vec<Lease> = Vec::new();
    // How long each kind of call takes uncut, so that the cuts land inside calls
    // rather than between them: on loopback a call takes from a fraction of a
    // millisecond (Redis) to a few (a SQL transaction).
    // The shortest of three tries: a first call may also load scripts or connect.
    let mut took = [Duration::MAX; 3];
    for _ in 0..3 {
        let once = time_each_call(&*cut, &q, &mut queues, &mut unsettled).await?;
        for (t, o) in took.iter_mut().zip(once) {
            *t = (*t).min(o);
        }
    }
    let mut errors = [0u32; 3];
    // At least 48 calls; more, up to 240, until a cut has failed a call of each kind:
    // on Redis a claim takes a fraction of a millisecond, and a cut timed at random
    // within it can miss every one of a few dozen.
    for round in 0..240 {
        if round >= 48 && errors.iter().all(|&e| e > 0) {
            break;
        }
        // Start each call on live connections, so that the cut lands inside it rather
        // than on the dead ones the last cut left behind.
        poll_until("the cut handle to answer again", PATIENCE, || async {
            Ok(cut.queue_stats(&q).await.is_ok().then_some(()))
        })
        .await?;
        let kind = usize::try_from(round % 3).unwrap_or(0);
        let delay = took[kind].mul_f64(fastrand::f64());
        // A thread of its own: it keeps time to a fraction of a millisecond, where
        // the runtime's timers round up to the next one.
        let cutter = {
            let proxy = proxy.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                proxy.cut();
            })
        };
        if kind == 2 && unsettled.len() < 20 {
            // The claims before were cut: give the settle leases to carry, taken
            // through the other handle, enough that the call lasts long enough to cut.
            let jobs = direct
                .claim(ClaimRequest::new(&q, "x3-direct", 30, CUT_LEASE))
                .await?;
            unsettled.extend(jobs.into_iter().map(|j| j.lease));
        }
        let outcome = one_call(&*cut, &q, round, &mut unsettled).await;
        cutter
            .join()
            .map_err(|_| anyhow::anyhow!("the cutting thread panicked"))?;
        match outcome {
            Call::Enqueue(queue, res) => {
                errors[0] += u32::from(transient(res.as_ref().err(), "enqueue")?);
                calls.push((queue, res.is_ok()));
            }
            Call::Claim(res) => {
                if let Ok(jobs) = &res {
                    unsettled.extend(jobs.iter().map(|j| j.lease.clone()));
                }
                errors[1] += u32::from(transient(res.as_ref().err(), "claim")?);
            }
            Call::Settle(sent, res) => {
                leases.extend(sent);
                match res {
                    Ok(each) => {
                        for r in each {
                            ensure!(
                                matches!(r, Ok(_) | Err(Error::StaleLease)),
                                "a settle after a cut gave {r:?}"
                            );
                        }
                    }
                    Err(e) => errors[2] += u32::from(transient(Some(&e), "settle")?),
                }
            }
        }
    }
    leases.extend(unsettled);
    for (queue, ok) in calls {
        let n = total(direct, &queue).await?;
        ensure!(
            n == 0 || n == CALL,
            "an enqueue of {CALL} jobs cut mid-call stored {n} of them"
        );
        ensure!(
            !ok || n == CALL,
            "an enqueue that succeeded stored {n} of {CALL} jobs"
        );
        if n == CALL {
            queues.push((queue, CALL));
        }
    }
    for (queue, want) in &queues {
        drain(direct, queue, *want).await?;
    }
    for lease in &leases {
        let res = direct.complete(lease).await;
        ensure!(
            matches!(res, Err(Error::StaleLease)),
            "a lease handed out before the cuts still settles job {} after it finished: \
             {res:?}",
            lease.job.0
        );
    }
    // Otherwise every cut fell between calls and the case proved nothing.
    ensure!(
        errors.iter().all(|&n| n > 0),
        "no cut failed a call of some kind (enqueue, claim, settle failures: {errors:?})"
    );
    Ok(())
}

/// Makes one call of each kind through `b` with no cut, and says how long each took
/// (at least 50 µs); the jobs it stores and the leases it takes join the rest.
async fn time_each_call(
    b: &dyn Backend,
    q: &str,
    queues: &mut Vec<(String, u64)>,
    unsettled: &mut Vec<Lease>,
) -> anyhow::Result<[Duration; 3]> {
    let mut took = [Duration::ZERO; 3];
    for (kind, slot) in took.iter_mut().enumerate() {
        let start = std::time::Instant::now();
        let call = one_call(b, q, kind as u64, unsettled).await;
        *slot = start.elapsed().max(Duration::from_micros(50));
        match call {
            Call::Enqueue(queue, res) => {
                res?;
                queues.push((queue, CALL));
            }
            Call::Claim(res) => unsettled.extend(res?.into_iter().map(|j| j.lease)),
            Call::Settle(_, res) => {
                res?;
            }
        }
    }
    Ok(took)
}

enum Call {
    Enqueue(String, relayq_core::Result<Vec<relayq_core::Enqueued>>),
    Claim(relayq_core::Result<Vec<relayq_core::ClaimedJob>>),
    Settle(
        Vec<Lease>,
        relayq_core::Result<Vec<relayq_core::Result<relayq_core::Settled>>>,
    ),
}

/// One call through the cut handle: an enqueue into a fresh queue, a claim, or a
/// settle of what earlier claims took, in turn.
async fn one_call(b: &dyn Backend, q: &str, round: u64, unsettled: &mut Vec<Lease>) -> Call {
    match round % 3 {
        0 => {
            let queue = queue_name("x3cut-e");
            let jobs = (0..CALL).map(|i| grouped(&queue, i)).collect();
            let res = b.enqueue(jobs).await;
            Call::Enqueue(queue, res)
        }
        1 => Call::Claim(b.claim(ClaimRequest::new(q, "x3-cut", 8, CUT_LEASE)).await),
        _ => {
            let sent = std::mem::take(unsettled);
            let settles = sent.iter().cloned().map(Settle::complete).collect();
            let res = b.settle_many(settles).await;
            Call::Settle(sent, res)
        }
    }
}

fn grouped(queue: &str, i: u64) -> NewJob {
    NewJob::new(queue, i.to_string().into_bytes())
        .group(format!("g{}", i % GROUPS))
        .max_attempts(1000)
}

/// Whether `error` is there; an error that is not transient fails the case (SPEC X4).
fn transient(error: Option<&Error>, call: &str) -> anyhow::Result<bool> {
    match error {
        None => Ok(false),
        Some(e) if e.is_transient() => Ok(true),
        Some(e) => bail!("a {call} cut mid-call failed with an error that is not transient: {e}"),
    }
}

/// Claims and completes every job of `queue` through `b` until `want` have succeeded
/// and nothing else is left; jobs held by leases lost in the cuts come back once
/// those run out.
async fn drain(b: &dyn Backend, queue: &str, want: u64) -> anyhow::Result<()> {
    poll_until(
        &format!("every job of {queue} to succeed after the cuts"),
        PATIENCE,
        || async {
            let jobs = b
                .claim(ClaimRequest::new(queue, "x3-drain", 100, PATIENCE))
                .await?;
            for job in &jobs {
                b.complete(&job.lease).await?;
            }
            let stats = b.queue_stats(queue).await?;
            let done = stats.count(JobState::Succeeded);
            ensure!(done <= want, "{done} jobs of {want} succeeded in {queue}");
            Ok((done == want).then_some(()))
        },
    )
    .await
}
