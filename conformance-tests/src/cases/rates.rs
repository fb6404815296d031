//! SPEC K8–K11 — rates: at most `count` starts of a queue in any window of `per`.

use std::time::Duration;

use anyhow::ensure;
use chrono::{DateTime, TimeDelta, Utc};
use relayq_core::{ClaimRequest, CompleteExt, Hold, InspectExt, NewJob, QueueUpdate, Rate, Why};
use tokio::time::Instant;

use super::support::{LEASE, claim, enqueue_all, expect_invalid, ids};
use crate::{Env, queue_name};

fn jobs(queue: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new(queue, format!("r{i}").into_bytes()))
        .collect()
}

async fn set_rate(
    b: &dyn relayq_core::Backend,
    queue: &str,
    rate: Option<Rate>,
) -> relayq_core::Result<()> {
    b.update_queue(queue, QueueUpdate::default().rate(rate))
        .await
}

/// Whether `d` lies within a few seconds of `want`: the server's clock moved on
/// between the claim and this check.
fn near(d: Duration, want: Duration) -> bool {
    d <= want && want - d < Duration::from_secs(5)
}

/// SPEC K8: a rate with a zero count or interval, an interval not in whole
/// milliseconds, or a burst above its count is `InvalidInput` on `rate`; nothing is
/// stored, and the text form is checked the same way.
pub async fn k8_bad_rates_are_refused(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k8bad");
    let second = Duration::from_secs(1);
    for (rate, what) in [
        (Rate::new(0, second), "a count of 0"),
        (Rate::new(5, Duration::ZERO), "an interval of 0"),
        (Rate::new(5, Duration::from_micros(1500)), "1.5 ms"),
        (Rate::new(5, Duration::from_secs(86_401)), "over a day"),
        (Rate::new(5, second).with_burst(6), "a burst over the count"),
        (Rate::new(5, second).with_burst(0), "a burst of 0"),
        (
            Rate::new(100_000, Duration::from_secs(86_400)).with_burst(100_000),
            "a burst reaching past ten years",
        ),
    ] {
        expect_invalid(set_rate(b, &q, Some(rate)).await, "rate", what)?;
    }
    for text in ["10/0s", "0/1s", "10", "10/1x", "-1/1s", "10/"] {
        expect_invalid(text.parse::<Rate>(), "rate", text)?;
    }
    let stats = b.queue_stats(&q).await?;
    ensure!(stats.rate.is_none(), "a refused rate was stored: {stats:?}");
    ensure!(
        !b.queues().await?.contains(&q),
        "a refused rate put the queue in use"
    );
    Ok(())
}

/// SPEC K8–K11: a rate of 2 per hour with a burst of 2 starts two jobs at once and
/// then none; the cut claim names the wait until the next start (one emission
/// interval, an hour), the same rate set again changes nothing, `queue_stats` shows
/// the rate and when it allows the next start, and `why` names it. Lifting the rate
/// lets the rest start; a rate set again after that starts afresh.
pub async fn k10_a_cut_claim_names_the_wait(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k10wait");
    let hour = Duration::from_secs(3600);
    let rate = Rate::new(2, hour).with_burst(2);
    set_rate(b, &q, Some(rate)).await?;
    let queued = enqueue_all(b, jobs(&q, 6)).await?;
    let got = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        ids(&got.jobs) == queued[..2],
        "a claim of 5 under 2/1h burst 2 took {:?}",
        ids(&got.jobs)
    );
    let wait = got
        .next_in
        .ok_or_else(|| anyhow::anyhow!("the cut claim named no wait"))?;
    ensure!(
        near(wait, hour),
        "the cut claim says wait {wait:?}; want about an hour"
    );
    let again = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        again.jobs.is_empty() && again.next_in.is_some_and(|w| near(w, hour)),
        "a second claim took {:?}, wait {:?}",
        ids(&again.jobs),
        again.next_in
    );
    // The same rate set again keeps its state: still no start.
    set_rate(b, &q, Some(rate)).await?;
    let same = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        same.jobs.is_empty(),
        "the same rate set again gave a fresh burst: {:?}",
        ids(&same.jobs)
    );
    let stats = b.queue_stats(&q).await?;
    let next = stats
        .rate_next
        .ok_or_else(|| anyhow::anyhow!("no next start: {stats:?}"))?;
    let ahead = (next - Utc::now()).to_std().unwrap_or_default();
    ensure!(
        stats.rate == Some(rate) && near(ahead, hour),
        "queue_stats reads rate {:?}, next start in {ahead:?}",
        stats.rate
    );
    match b.why(&q, queued[2]).await? {
        Why::Held(holds)
            if holds
                .iter()
                .any(|h| matches!(h, Hold::Rate { rate: r, .. } if *r == rate)) => {}
        other => anyhow::bail!("why names {other:?}, not the rate"),
    }
    // Lifted: the rest start at once, and nothing names a wait.
    set_rate(b, &q, None).await?;
    let rest = b.claim_paced(ClaimRequest::new(&q, "w", 2, LEASE)).await?;
    ensure!(
        ids(&rest.jobs) == queued[2..4] && rest.next_in.is_none(),
        "after the rate was lifted a claim of 2 took {:?}, wait {:?}",
        ids(&rest.jobs),
        rest.next_in
    );
    ensure!(
        b.queue_stats(&q).await?.rate.is_none(),
        "the lifted rate still shows"
    );
    // Set again, it starts afresh: its burst is there at once.
    set_rate(b, &q, Some(Rate::new(1, hour))).await?;
    let fresh = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        ids(&fresh.jobs) == queued[4..5] && fresh.next_in.is_some(),
        "a rate set again gave {:?}, wait {:?}",
        ids(&fresh.jobs),
        fresh.next_in
    );
    Ok(())
}

/// SPEC K10: only the rate names a wait. A claim cut by `max_running`, a claim that
/// emptied the queue and a claim of an empty queue name none, and take nothing from
/// the rate they did not use.
pub async fn k10_only_the_rate_names_a_wait(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k10only");
    let rate = Rate::new(3, Duration::from_secs(3600)).with_burst(3);
    set_rate(b, &q, Some(rate)).await?;
    let empty = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        empty.next_in.is_none(),
        "an empty queue's claim named a wait"
    );
    b.set_max_running(&q, Some(1)).await?;
    let queued = enqueue_all(b, jobs(&q, 2)).await?;
    let capped = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        ids(&capped.jobs) == queued[..1] && capped.next_in.is_none(),
        "under max_running 1 a claim took {:?}, wait {:?}",
        ids(&capped.jobs),
        capped.next_in
    );
    b.set_max_running(&q, None).await?;
    let drained = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        ids(&drained.jobs) == queued[1..] && drained.next_in.is_none(),
        "a claim that emptied the queue took {:?}, wait {:?}",
        ids(&drained.jobs),
        drained.next_in
    );
    // One start of the three is left.
    let more = enqueue_all(b, jobs(&q, 3)).await?;
    let last = b.claim_paced(ClaimRequest::new(&q, "w", 5, LEASE)).await?;
    ensure!(
        ids(&last.jobs) == more[..1] && last.next_in.is_some(),
        "the rate's last start gave {:?}, wait {:?}",
        ids(&last.jobs),
        last.next_in
    );
    Ok(())
}

/// SPEC K9: under four claimers on two handles, claiming as fast as they can for
/// 1.6 s, a rate of 10 per 400 ms never starts more than 10 jobs in any 400 ms of the
/// server's clock (each start read from its lease: expiry less the lease), and keeps
/// starting jobs. The claimers sleep the wait a cut claim names, as the worker does.
pub async fn k9_no_window_holds_more_than_the_count(env: &Env) -> anyhow::Result<()> {
    let b = env.shared();
    let q = queue_name("k9win");
    let per = Duration::from_millis(400);
    set_rate(&*b, &q, Some(Rate::new(10, per))).await?;
    enqueue_all(&*b, jobs(&q, 400)).await?;
    let handles = [b.clone(), env.connect().await?];
    let deadline = Instant::now() + Duration::from_millis(1600);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, h) in handles.iter().cycle().take(4).enumerate() {
        let (h, q) = (h.clone(), q.clone());
        tasks.spawn(async move {
            let mut starts: Vec<DateTime<Utc>> = Vec::new();
            while Instant::now() < deadline {
                let got = h
                    .claim_paced(ClaimRequest::new(&q, format!("w{i}"), 3, LEASE))
                    .await?;
                for j in &got.jobs {
                    starts.push(j.lease.expires_at - TimeDelta::from_std(LEASE)?);
                    h.complete(&j.lease).await?;
                }
                if let Some(wait) = got.next_in {
                    tokio::time::sleep(wait.min(Duration::from_millis(100))).await;
                }
            }
            anyhow::Ok(starts)
        });
    }
    let mut starts = Vec::new();
    while let Some(r) = tasks.join_next().await {
        starts.extend(r??);
    }
    starts.sort_unstable();
    let window = TimeDelta::from_std(per)?;
    for (i, t) in starts.iter().enumerate() {
        let within = starts[i..].iter().take_while(|s| **s < *t + window).count();
        ensure!(
            within <= 10,
            "{within} jobs started in the 400 ms from {t} under a rate of 10/400ms"
        );
    }
    // 1.6 s at 25 a second is 40; claimers slowed by a busy machine lose some.
    ensure!(
        starts.len() >= 10,
        "only {} jobs started in 1.6 s under a rate of 10/400ms",
        starts.len()
    );
    Ok(())
}

/// SPEC K9 with K2: a rate counts a keyed queue's starts, and a full key's jobs do not
/// use it up.
pub async fn k9_a_rate_and_key_limits_combine(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k9keys");
    b.set_key_limit(&q, Some("a"), Some(1)).await?;
    set_rate(
        b,
        &q,
        Some(Rate::new(3, Duration::from_secs(3600)).with_burst(3)),
    )
    .await?;
    let mut all: Vec<NewJob> = (0..3)
        .map(|i| NewJob::new(&q, format!("a{i}").into_bytes()).limit_key("a"))
        .collect();
    all.extend(jobs(&q, 3));
    let queued = enqueue_all(b, all).await?;
    let got = b.claim_paced(ClaimRequest::new(&q, "w", 10, LEASE)).await?;
    ensure!(
        ids(&got.jobs) == [queued[0], queued[3], queued[4]] && got.next_in.is_some(),
        "a claim of 10 took {:?} (wait {:?}); want a0, r0 and r1: key a holds 1, the rate 3",
        ids(&got.jobs),
        got.next_in
    );
    b.complete(&got.jobs[0].lease).await?;
    ensure!(
        claim(b, &q, 10).await?.is_empty(),
        "the rate's three starts were used, yet a claim took more"
    );
    Ok(())
}

/// SPEC K8, K9: the default burst is 1 % of the count, so a claim under a high rate
/// takes many jobs at once; set to 1, the same rate gives one job per claim.
pub async fn k9_the_default_burst_lets_a_claim_take_many(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k9burst");
    let rate = Rate::new(1000, Duration::from_secs(3600));
    ensure!(
        rate.burst == 10,
        "the default burst of 1000/1h is {}",
        rate.burst
    );
    set_rate(b, &q, Some(rate)).await?;
    let queued = enqueue_all(b, jobs(&q, 30)).await?;
    let got = b.claim_paced(ClaimRequest::new(&q, "w", 20, LEASE)).await?;
    ensure!(
        ids(&got.jobs) == queued[..10] && got.next_in.is_some(),
        "a claim of 20 under 1000/1h took {:?}, wait {:?}; want the burst of 10",
        ids(&got.jobs),
        got.next_in
    );
    set_rate(b, &q, Some(rate.with_burst(1))).await?;
    let one = b.claim_paced(ClaimRequest::new(&q, "w", 20, LEASE)).await?;
    ensure!(
        ids(&one.jobs) == queued[10..11],
        "with a burst of 1 a claim of 20 took {:?}",
        ids(&one.jobs)
    );
    Ok(())
}
