//! SPEC K — limit keys: at most a key's limit of its jobs run at once, and a full key
//! holds up nobody else.

use std::time::Duration;

use anyhow::ensure;
use relayq_core::{
    Backend, ClaimRequest, ClaimedJob, CompleteExt, Hold, InspectExt, JobId, JobState, NewJob,
    Retry, Why,
};
use tokio::time::Instant;

use super::support::{
    LEASE, PATIENCE, SHORT_LEASE, claim, claim_as, enqueue, enqueue_all, expect_invalid, ids,
    total, unfinished,
};
use crate::{Env, poll_until, queue_name};

fn keyed(queue: &str, key: &str, i: usize) -> NewJob {
    NewJob::new(queue, format!("{key}-{i}").into_bytes()).limit_key(key)
}

fn keys_of(got: &[ClaimedJob]) -> Vec<String> {
    got.iter()
        .map(|j| {
            String::from_utf8_lossy(&j.payload)
                .split('-')
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

fn count(got: &[ClaimedJob], key: &str) -> usize {
    keys_of(got).iter().filter(|k| *k == key).count()
}

/// The running count `key_limits` reports for `key`.
async fn running_of(b: &dyn Backend, queue: &str, key: &str) -> anyhow::Result<u64> {
    let keys = b.key_limits(queue).await?;
    Ok(keys
        .keys
        .iter()
        .find(|k| k.key == key)
        .map_or(0, |k| k.running))
}

/// SPEC K1: a bad key or a limit of zero is `InvalidInput` naming the field, and
/// nothing is stored.
pub async fn k1_bad_keys_and_limits_are_refused(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k1bad");
    expect_invalid(
        b.enqueue(vec![NewJob::new(&q, vec![]).limit_key("")]).await,
        "limit_key",
        "an empty limit key",
    )?;
    expect_invalid(
        b.enqueue(vec![
            NewJob::new(&q, vec![]),
            NewJob::new(&q, vec![]).limit_key("a\nb"),
        ])
        .await,
        "limit_key",
        "a limit key with a newline",
    )?;
    ensure!(total(b, &q).await? == 0, "a refused enqueue stored jobs");
    expect_invalid(
        b.set_key_limit(&q, None, Some(0)).await,
        "key_limit",
        "limit 0",
    )?;
    expect_invalid(
        b.set_key_limit(&q, Some("k"), Some(0)).await,
        "key_limit",
        "a key's limit 0",
    )?;
    expect_invalid(
        b.set_key_limit(&q, Some(&"k".repeat(256)), Some(1)).await,
        "limit_key",
        "a 256-byte key",
    )?;
    let keys = b.key_limits(&q).await?;
    ensure!(
        keys.default.is_none() && keys.keys.is_empty(),
        "refused limits were stored: {keys:?}"
    );
    Ok(())
}

/// SPEC K2, K4, K7: a claim takes at most each key's limit, passes over a full key's
/// jobs to fill its `limit` from others (keyless jobs, other keys), and `key_limits`
/// shows each key's running count and limit.
pub async fn k2_a_claim_takes_at_most_each_key_s_limit(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k2cap");
    b.set_key_limit(&q, None, Some(2)).await?;
    b.set_key_limit(&q, Some("a"), Some(1)).await?;
    let mut jobs: Vec<NewJob> = (0..5).map(|i| keyed(&q, "a", i)).collect();
    jobs.extend((0..5).map(|i| keyed(&q, "b", i)));
    jobs.extend((0..3).map(|i| NewJob::new(&q, format!("free-{i}").into_bytes())));
    enqueue_all(b, jobs).await?;
    let got = claim(b, &q, 20).await?;
    ensure!(
        count(&got, "a") == 1 && count(&got, "b") == 2 && count(&got, "free") == 3,
        "a claim of 20 took {:?}; want 1 of a (limit 1), 2 of b (default 2), 3 keyless",
        keys_of(&got)
    );
    let keys = b.key_limits(&q).await?;
    ensure!(
        keys.default == Some(2),
        "default limit reads {:?}",
        keys.default
    );
    let a = keys.keys.iter().find(|k| k.key == "a");
    let bk = keys.keys.iter().find(|k| k.key == "b");
    ensure!(
        a.is_some_and(|k| k.running == 1 && k.own == Some(1) && k.limit == Some(1))
            && bk.is_some_and(|k| k.running == 2 && k.own.is_none() && k.limit == Some(2)),
        "key_limits reads {keys:?}"
    );
    ensure!(
        claim(b, &q, 20).await?.is_empty(),
        "both keys are full, yet a claim took more"
    );
    // A slot freed takes exactly one more job of its key, the earliest.
    let b0 = got
        .iter()
        .find(|j| j.payload == b"b-0")
        .expect("b-0 was claimed");
    b.complete(&b0.lease).await?;
    let next = claim(b, &q, 20).await?;
    ensure!(
        keys_of(&next) == ["b"] && next[0].payload == b"b-2",
        "after one b finished a claim took {:?}",
        next.iter()
            .map(|j| String::from_utf8_lossy(&j.payload).into_owned())
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// SPEC K4: a full key's backlog, however long, holds up nobody from the first claim
/// on: 5,000 jobs of a key of limit 1 and then one job each of 9 other keys; a claim
/// of 10 takes the key's first job and the 9 others (a claim that had to read past the
/// backlog would stop at its scan bound first).
pub async fn k4_a_long_backlog_of_a_full_key_is_passed_at_once(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k4long");
    b.set_key_limit(&q, Some("hot"), Some(1)).await?;
    let mut hot = Vec::new();
    for chunk in 0..5 {
        let jobs = (0..1000)
            .map(|i| keyed(&q, "hot", chunk * 1000 + i))
            .collect();
        hot.extend(enqueue_all(b, jobs).await?);
    }
    let cold: Vec<NewJob> = (0..9).map(|i| keyed(&q, &format!("c{i}"), i)).collect();
    let cold = enqueue_all(b, cold).await?;
    let got = claim(b, &q, 10).await?;
    let mut want = vec![hot[0]];
    want.extend(&cold);
    ensure!(
        ids(&got) == want,
        "a claim of 10 took {} jobs ({:?}); want the hot key's first and the 9 others",
        got.len(),
        keys_of(&got)
    );
    Ok(())
}

/// SPEC K4: jobs parked as they are enqueued all run, in order. A backlog of 200 jobs
/// of a key of limit 2 is enqueued first (most of it parked at once where the backend
/// parks at enqueue); then producers enqueue 480 more in batches of 40 while claimers
/// take and complete them, so new jobs are parked while the jobs counted ahead of them
/// are claimed and finished. Every job must finish (one parked with nothing left to
/// put it back would wait forever), and the backlog's jobs must start in order (by
/// their start on the server's clock).
pub async fn k4_jobs_parked_at_enqueue_all_run(env: &Env) -> anyhow::Result<()> {
    let b = env.shared();
    let q = queue_name("k4race");
    b.set_key_limit(&q, Some("k"), Some(2)).await?;
    let backlog = enqueue_all(&*b, (0..200).map(|i| keyed(&q, "k", i)).collect()).await?;
    let mut handles = vec![b.clone()];
    for _ in 0..2 {
        handles.push(env.connect().await?);
    }
    const TOTAL: usize = 200 + 480;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deadline = Instant::now() + PATIENCE;
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..3 {
        let (h, q) = (handles[p % handles.len()].clone(), q.clone());
        producers.spawn(async move {
            for round in 0..4 {
                let jobs = (0..40).map(|i| keyed(&q, "k", 1000 + p * 1000 + round * 100 + i));
                h.enqueue(jobs.collect()).await?;
                tokio::task::yield_now().await;
            }
            anyhow::Ok(())
        });
    }
    let mut claimers = tokio::task::JoinSet::new();
    for (i, h) in handles.iter().cycle().take(4).enumerate() {
        let (h, q, done) = (h.clone(), q.clone(), done.clone());
        claimers.spawn(async move {
            let mut started = Vec::new();
            while done.load(std::sync::atomic::Ordering::SeqCst) < TOTAL {
                ensure!(
                    Instant::now() < deadline,
                    "{} of {TOTAL} jobs ran in time",
                    done.load(std::sync::atomic::Ordering::SeqCst)
                );
                let got = h
                    .claim(ClaimRequest::new(&q, format!("w{i}"), 4, LEASE))
                    .await?;
                for j in got {
                    let start = j.lease.expires_at - chrono::TimeDelta::from_std(LEASE)?;
                    started.push((start, j.id()));
                    h.complete(&j.lease).await?;
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
            }
            anyhow::Ok(started)
        });
    }
    while let Some(r) = producers.join_next().await {
        r??;
    }
    let mut started = Vec::new();
    while let Some(r) = claimers.join_next().await {
        started.extend(r??);
    }
    let left = unfinished(&*b, &q).await?;
    ensure!(left == 0, "{left} jobs left unfinished");
    started.sort_unstable();
    let order: Vec<JobId> = started
        .into_iter()
        .map(|(_, id)| id)
        .filter(|id| backlog.contains(id))
        .collect();
    ensure!(
        order == backlog,
        "the backlog started out of order: {order:?}"
    );
    Ok(())
}

/// SPEC K4: a key of limit 1 starts its jobs one at a time in order, across jobs a
/// claim parked (the key was full when it read them) and jobs an enqueue parked behind
/// them (on PostgreSQL: because a parked job of the key was ahead; elsewhere because
/// 64 waiting jobs were).
pub async fn k4_a_key_starts_in_order_past_parked_jobs(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k4order");
    b.set_key_limit(&q, Some("k"), Some(1)).await?;
    let mut want = enqueue_all(b, (0..10).map(|i| keyed(&q, "k", i)).collect()).await?;
    let mut got = claim(b, &q, 10).await?;
    want.extend(enqueue_all(b, (10..110).map(|i| keyed(&q, "k", i)).collect()).await?);
    let mut order = Vec::new();
    while let [job] = got.as_slice() {
        order.push(job.id());
        b.complete(&job.lease).await?;
        got = claim(b, &q, 10).await?;
    }
    ensure!(
        got.is_empty(),
        "a claim took {} jobs of a key of limit 1",
        got.len()
    );
    ensure!(
        order == want,
        "the key's jobs started in the order {order:?}"
    );
    Ok(())
}

/// SPEC K4: a key with many waiting jobs ahead of the others holds up nobody: each
/// claim takes the other keys' jobs, and the full key's jobs start in order as its
/// slot frees.
pub async fn k4_a_waiting_key_does_not_block_others(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k4hot");
    b.set_key_limit(&q, Some("hot"), Some(1)).await?;
    let hot = enqueue_all(b, (0..300).map(|i| keyed(&q, "hot", i)).collect()).await?;
    let mut others = Vec::new();
    let mut held_hot = None;
    for round in 0..3 {
        let cold: Vec<NewJob> = (0..4).map(|i| keyed(&q, "cold", round * 10 + i)).collect();
        others.extend(enqueue_all(b, cold).await?);
        let got = claim(b, &q, 10).await?;
        let want_hot = usize::from(round == 0);
        ensure!(
            count(&got, "hot") == want_hot && count(&got, "cold") == 4,
            "round {round}: a claim of 10 took {:?}; want {want_hot} hot and the 4 cold",
            keys_of(&got)
        );
        for j in got {
            if count(std::slice::from_ref(&j), "hot") == 1 {
                ensure!(
                    j.id() == hot[0],
                    "the first hot job to start was {}",
                    j.id()
                );
                held_hot = Some(j);
            } else {
                b.complete(&j.lease).await?;
            }
        }
    }
    let first = held_hot.expect("the hot key's first job was claimed");
    b.complete(&first.lease).await?;
    // The hot key's next jobs start one at a time, in order.
    for want in &hot[1..4] {
        let got = claim(b, &q, 10).await?;
        ensure!(
            ids(&got) == [*want],
            "expected hot job {want}, got {:?}",
            ids(&got)
        );
        b.complete(&got[0].lease).await?;
    }
    ensure!(others.len() == 12, "12 cold jobs were enqueued");
    Ok(())
}

/// SPEC K2: under concurrent claimers whose leases expire, a key never has more
/// running jobs than its limit. Each attempt is taken to run from its claim (server
/// time: its lease's expiry less the lease) to no later than it truly ended: the moment
/// its completion was sent, or its lease's expiry, whichever came first. So every
/// overlap counted is real (the server and this process share a clock here).
pub async fn k2_a_limit_holds_under_concurrent_claimers_and_expiry(
    env: &Env,
) -> anyhow::Result<()> {
    let b = env.shared();
    let q = queue_name("k2race");
    b.set_key_limit(&q, Some("k"), Some(3)).await?;
    enqueue_all(&*b, (0..40).map(|i| keyed(&q, "k", i)).collect()).await?;
    let mut handles = vec![b.clone()];
    for _ in 0..3 {
        handles.push(env.connect().await?);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, h) in handles.iter().cycle().take(8).enumerate() {
        let (h, q) = (h.clone(), q.clone());
        tasks.spawn(async move {
            let mut spans = Vec::new();
            while Instant::now() < deadline {
                let got = h
                    .claim(ClaimRequest::new(&q, format!("w{i}"), 2, SHORT_LEASE))
                    .await?;
                for j in got {
                    let expiry = j.lease.expires_at;
                    let start = expiry - chrono::TimeDelta::from_std(SHORT_LEASE)?;
                    // Half the claimers leave their jobs to expire.
                    let end = if i % 2 == 0 {
                        let sent = chrono::Utc::now();
                        let _ = h.complete(&j.lease).await;
                        sent.min(expiry)
                    } else {
                        expiry
                    };
                    spans.push((start, end));
                }
                tokio::task::yield_now().await;
            }
            anyhow::Ok(spans)
        });
    }
    let mut edges = Vec::new();
    while let Some(r) = tasks.join_next().await {
        for (start, end) in r?? {
            edges.push((start, 1_i32));
            edges.push((end, -1));
        }
    }
    ensure!(!edges.is_empty(), "no claimer got a job");
    // Ends sort before starts at the same instant: a slot freed and retaken at once.
    edges.sort_unstable();
    let (mut now, mut worst) = (0, 0);
    for (_, step) in edges {
        now += step;
        worst = worst.max(now);
    }
    ensure!(
        worst <= 3,
        "{worst} attempts of a key with limit 3 ran at once"
    );
    let running = running_of(&*b, &q, "k").await?;
    ensure!(running <= 3, "key_limits says {running} run, limit 3");
    Ok(())
}

/// SPEC K3: limits change at run time. Raising one lets the next claim take more;
/// lowering one below the running count stops nothing and starts nothing until the
/// key is under it.
pub async fn k3_limits_change_at_run_time(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k3set");
    b.set_key_limit(&q, Some("k"), Some(1)).await?;
    enqueue_all(b, (0..6).map(|i| keyed(&q, "k", i)).collect()).await?;
    let first = claim(b, &q, 10).await?;
    ensure!(first.len() == 1, "limit 1: a claim took {}", first.len());
    b.set_key_limit(&q, Some("k"), Some(3)).await?;
    let more = claim(b, &q, 10).await?;
    ensure!(more.len() == 2, "raised to 3: a claim took {}", more.len());
    b.set_key_limit(&q, Some("k"), Some(1)).await?;
    ensure!(
        running_of(b, &q, "k").await? == 3,
        "lowering stopped running jobs"
    );
    b.complete(&first[0].lease).await?;
    b.complete(&more[0].lease).await?;
    ensure!(
        claim(b, &q, 10).await?.is_empty(),
        "one of limit 1 runs, yet a claim took more"
    );
    b.complete(&more[1].lease).await?;
    let next = claim(b, &q, 10).await?;
    ensure!(
        next.len() == 1,
        "under the limit again: a claim took {}",
        next.len()
    );
    // Lifting the key's own limit leaves the default: none, so the rest run.
    b.set_key_limit(&q, Some("k"), None).await?;
    let rest = claim(b, &q, 10).await?;
    ensure!(
        rest.len() == 2,
        "limit lifted: a claim took {} of 2",
        rest.len()
    );
    Ok(())
}

/// SPEC K2: whatever takes a job out of `running` frees its slot: a release, a cancel,
/// a failure into backoff, and an expired lease (processed before the job is claimed
/// again, as attempt 2).
pub async fn k2_every_way_out_of_running_frees_the_slot(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k2free");
    b.set_key_limit(&q, None, Some(1)).await?;
    let ids = enqueue_all(b, (0..5).map(|i| keyed(&q, "k", i)).collect()).await?;
    let one = claim(b, &q, 5).await?;
    ensure!(
        ids_of(&one) == [ids[0]],
        "first claim took {:?}",
        ids_of(&one)
    );
    b.release(&one[0].lease).await?;
    let again = claim(b, &q, 5).await?;
    ensure!(
        ids_of(&again) == [ids[0]],
        "after a release: {:?}",
        ids_of(&again)
    );
    b.cancel_job(&q, ids[0]).await?;
    let after_cancel = claim(b, &q, 5).await?;
    ensure!(
        ids_of(&after_cancel) == [ids[1]],
        "after a cancel: {:?}",
        ids_of(&after_cancel)
    );
    b.fail(
        &after_cancel[0].lease,
        "boom",
        Retry::After(Duration::from_secs(3600)),
    )
    .await?;
    let after_fail = claim(b, &q, 5).await?;
    ensure!(
        ids_of(&after_fail) == [ids[2]],
        "after a failure: {:?}",
        ids_of(&after_fail)
    );
    b.release(&after_fail[0].lease).await?;
    let short = claim_as(b, &q, "zombie", 5, SHORT_LEASE).await?;
    ensure!(
        ids_of(&short) == [ids[2]],
        "short-lease claim: {:?}",
        ids_of(&short)
    );
    let taken = poll_until("the expired job's slot to free", PATIENCE, || async {
        let got = claim_as(b, &q, "heir", 5, LEASE).await?;
        Ok((!got.is_empty()).then_some(got))
    })
    .await?;
    ensure!(
        taken.len() == 1 && taken[0].id() == ids[2] && taken[0].attempt() == 2,
        "after expiry a claim took {:?}",
        taken
            .iter()
            .map(|j| (j.id(), j.attempt()))
            .collect::<Vec<_>>()
    );
    Ok(())
}

fn ids_of(got: &[ClaimedJob]) -> Vec<JobId> {
    ids(got)
}

/// SPEC K5: a job with a group and a key needs both; a group's head waiting for its
/// key holds up only its group.
pub async fn k5_groups_and_keys_combine(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k5grp");
    b.set_key_limit(&q, None, Some(1)).await?;
    let blocker = enqueue(b, keyed(&q, "k", 0)).await?;
    let g1 = enqueue(b, keyed(&q, "k", 1).group("g")).await?;
    let g2 = enqueue(b, NewJob::new(&q, b"g-2".to_vec()).group("g")).await?;
    let other = enqueue(b, NewJob::new(&q, b"o-0".to_vec()).group("h")).await?;
    let got = claim(b, &q, 10).await?;
    ensure!(
        ids(&got) == [blocker, other],
        "want the key's first job and the other group's, got {:?}",
        ids(&got)
    );
    b.complete(&got[0].lease).await?;
    let next = claim(b, &q, 10).await?;
    ensure!(
        ids(&next) == [g1],
        "want the group's head once its key is free: {:?}",
        ids(&next)
    );
    b.complete(&next[0].lease).await?;
    let last = claim(b, &q, 10).await?;
    ensure!(
        ids(&last) == [g2],
        "then the group's next: {:?}",
        ids(&last)
    );
    Ok(())
}

/// SPEC K6: jobs claimed ahead of a claim's `slots` never take their key's last free
/// slot; a later claim for free slots takes them.
pub async fn k6_claims_ahead_leave_a_key_s_last_slot(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k6ahead");
    b.set_key_limit(&q, Some("one"), Some(1)).await?;
    b.set_key_limit(&q, Some("three"), Some(3)).await?;
    let free = enqueue(b, NewJob::new(&q, b"free-0".to_vec())).await?;
    let one = enqueue(b, keyed(&q, "one", 0)).await?;
    let three = enqueue_all(b, (0..3).map(|i| keyed(&q, "three", i)).collect()).await?;
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE).with_slots(1))
        .await?;
    ensure!(
        ids(&got) == [free, three[0], three[1]],
        "a claim of 10 with 1 slot took {:?}; want the keyless job in its slot and 2 of \
         'three' ahead, leaving 'one' (limit 1) and the last slot of 'three'",
        ids(&got)
    );
    let now = claim(b, &q, 10).await?;
    ensure!(
        ids(&now) == [one, three[2]],
        "a claim for free slots took {:?}",
        ids(&now)
    );
    Ok(())
}

/// SPEC K7, M6: `why` names a full key.
pub async fn k7_why_names_a_full_key(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k7why");
    b.set_key_limit(&q, Some("k"), Some(1)).await?;
    let ids = enqueue_all(b, (0..2).map(|i| keyed(&q, "k", i)).collect()).await?;
    let got = claim(b, &q, 1).await?;
    ensure!(got.len() == 1, "a claim took {}", got.len());
    let info = b.job(&q, ids[1]).await?;
    ensure!(
        info.limit_key.as_deref() == Some("k") && info.state == JobState::Ready,
        "the waiting job reads key {:?}, state {:?}",
        info.limit_key,
        info.state
    );
    let why = b.why(&q, ids[1]).await?;
    let want = Hold::Key {
        key: "k".into(),
        running: 1,
        limit: 1,
    };
    ensure!(why == Why::Held(vec![want]), "why says {why:?}");
    b.complete(&got[0].lease).await?;
    ensure!(
        b.why(&q, ids[1]).await? == Why::Claimable,
        "with the key free, why still holds it"
    );
    Ok(())
}

/// SPEC K4: a waiting job put back when a slot freed, then cancelled before any claim
/// took it, passes its turn on: the key's next job runs; and a purge cancels a full
/// key's waiting jobs too (SPEC B9).
pub async fn k4_a_cancelled_waiting_job_passes_its_turn_on(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k4pass");
    b.set_key_limit(&q, Some("k"), Some(1)).await?;
    let ids = enqueue_all(b, (0..4).map(|i| keyed(&q, "k", i)).collect()).await?;
    let first = claim(b, &q, 10).await?;
    ensure!(
        ids_of(&first) == [ids[0]],
        "the first claim took {:?}",
        ids_of(&first)
    );
    b.complete(&first[0].lease).await?;
    b.cancel_job(&q, ids[1]).await?;
    let next = claim(b, &q, 10).await?;
    ensure!(
        ids_of(&next) == [ids[2]],
        "with the key's next job cancelled, a claim took {:?}",
        ids_of(&next)
    );
    let cancelled = b.purge(&q).await?;
    ensure!(
        cancelled == 2,
        "purge cancelled {cancelled} of the 2 unfinished jobs"
    );
    let stats = b.queue_stats(&q).await?;
    let left = stats.count(JobState::Ready) + stats.count(JobState::Running);
    ensure!(
        left == 0,
        "after the purge {left} jobs are ready or running: {stats:?}"
    );
    Ok(())
}

/// SPEC K6 with C6: a queue's `max_running` cuts a claim, and what it claims ahead
/// still never takes a key's last slot.
pub async fn k6_claims_ahead_under_max_running(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("k6max");
    b.set_max_running(&q, Some(3)).await?;
    b.set_key_limit(&q, Some("k"), Some(2)).await?;
    let free = enqueue(b, NewJob::new(&q, b"free-0".to_vec())).await?;
    let k = enqueue_all(b, (0..2).map(|i| keyed(&q, "k", i)).collect()).await?;
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE).with_slots(1))
        .await?;
    ensure!(
        ids(&got) == [free, k[0]],
        "a claim of 10 (max_running 3) with 1 slot took {:?}; want the keyless job and \
         one of 'k' ahead, leaving its last slot",
        ids(&got)
    );
    Ok(())
}
