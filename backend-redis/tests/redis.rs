//! Redis-specific behaviour, against the real server (`RELAYQ_REDIS_URL`, or a
//! container); without one each test is reported as ignored, with the reason.

use std::time::Duration;

use redis::AsyncCommands;
use relayq_conformance::queue_name;
use relayq_core::{
    Admin, Claim, ClaimRequest, ClaimedJob, Complete, CompleteExt, Enqueue, EnqueueExt, Error,
    Inspect, JobState, NewJob, OnFailure, OrderBarrier, Settled,
};
use relayq_redis::RedisBackend;

mod support;
use support::{jobs, setup};

const LEASE: Duration = Duration::from_secs(30);

/// Order keys stay exact at the priority extremes and with ids beyond 2^32: the claim
/// returns priority first, then id, and every id survives the round trip.
async fn order_is_exact_at_extremes(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("extremes");
    let start: i64 = (1 << 32) + 5;
    let _: () = raw
        .set(format!("{}:seq", b.queue_key(&q)), start)
        .await
        .unwrap();
    let at = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let mut batch = Vec::new();
    for p in [32767_i16, 0, -32768, 32767, -32768, 0] {
        batch.push(NewJob::new(&q, vec![]).priority(p).run_at(at));
    }
    let ids: Vec<i64> = b
        .enqueue(batch)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id.0)
        .collect();
    assert_eq!(ids, (start + 1..=start + 6).collect::<Vec<_>>());
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    let order: Vec<(i16, i64)> = got.iter().map(|j| (j.priority, j.lease.job.0)).collect();
    assert_eq!(
        order,
        vec![
            (-32768, start + 3),
            (-32768, start + 5),
            (0, start + 2),
            (0, start + 6),
            (32767, start + 1),
            (32767, start + 4),
        ]
    );
}

async fn pruned_queue_returns_to_its_baseline(url: String) {
    returns_to_its_baseline(&url, Kind::Plain).await;
}

/// The same with every job in a sealed batch of two stages: the batches go too.
async fn pruned_batches_return_to_the_baseline(url: String) {
    returns_to_its_baseline(&url, Kind::Batched).await;
}

/// The same with the jobs in 50 groups, the groups and their holders gone with them.
async fn pruned_groups_return_to_the_baseline(url: String) {
    returns_to_its_baseline(&url, Kind::Grouped).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    Batched,
    Grouped,
}

async fn returns_to_its_baseline(url: &str, kind: Kind) {
    let (b, mut raw) = setup(url).await;
    let q = queue_name("prune");
    let drain = |n: usize| {
        let b = b.clone();
        let q = q.clone();
        async move {
            for chunk in 0..n.div_ceil(1000) {
                let size = (n - chunk * 1000).min(1000);
                let mut new = jobs(&q, size);
                if kind == Kind::Grouped {
                    for (i, job) in new.iter_mut().enumerate() {
                        *job = job.clone().group(format!("g{}", i % 50));
                    }
                }
                let batch = if kind == Kind::Batched {
                    let batch = b.open_batch(&q, OnFailure::Halt).await.unwrap();
                    for (i, job) in new.iter_mut().enumerate() {
                        *job = job.clone().in_batch(batch.id, i32::from(i % 2 == 1));
                    }
                    Some(batch)
                } else {
                    None
                };
                b.enqueue(new).await.unwrap();
                if let Some(batch) = &batch {
                    b.seal(batch).await.unwrap();
                }
                // Each round finishes at least one job of the chunk: more rounds than
                // jobs means a finished job came back.
                for round in 0.. {
                    assert!(round <= size, "claims did not run dry: a job ran again");
                    let got = b
                        .claim(ClaimRequest::new(&q, "w", 1000, LEASE))
                        .await
                        .unwrap();
                    if got.is_empty() {
                        break;
                    }
                    let settles = got
                        .into_iter()
                        .map(|j| relayq_core::Settle::complete(j.lease))
                        .collect();
                    for r in b.settle_many(settles).await.unwrap() {
                        r.unwrap();
                    }
                }
            }
            let m = b.maintain(&q, Duration::ZERO).await.unwrap();
            assert_eq!(m.pruned, n as u64);
        }
    };
    drain(1).await;
    let baseline = footprint(&mut raw, &b.queue_key(&q)).await;
    drain(10_000).await;
    let after = footprint(&mut raw, &b.queue_key(&q)).await;
    assert_eq!(after.0, baseline.0, "keys after pruning");
    assert!(
        after.1 <= baseline.1 + 64,
        "memory after pruning {} vs baseline {}",
        after.1,
        baseline.1
    );
    assert_eq!(b.queue_stats(&q).await.unwrap().total(), 0);
}

/// The queue's keys and the memory they use.
async fn footprint(raw: &mut redis::aio::MultiplexedConnection, base: &str) -> (Vec<String>, u64) {
    let pattern = format!("{}*", base.replace('{', "\\{").replace('}', "\\}"));
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(raw)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    let mut memory = 0;
    for k in &keys {
        let used: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query_async(raw)
            .await
            .unwrap();
        memory += used.unwrap_or(0);
    }
    (keys, memory)
}

/// Bad prefixes and unreachable servers are clear errors, never panics.
async fn bad_prefix_and_unreachable_server_are_errors(url: String) {
    let err = RedisBackend::connect_with_prefix("redis://127.0.0.1:1", "a{b}")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "prefix",
                ..
            }
        ),
        "{err}"
    );
    let err = RedisBackend::connect("not a url").await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { field: "url", .. }),
        "{err}"
    );
    let err = RedisBackend::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let (b, _) = setup(&url).await;
    b.pause(&queue_name("x")).await.unwrap();
}

/// A job stored before jobs kept their fixed fields in one hash value (`f`) is
/// claimed with the same fields as one stored now: the claim rebuilds the value from
/// the separate fields.
async fn jobs_stored_without_the_fixed_fields_value_claim_the_same(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("packed");
    let batch = b
        .open_batch(&q, relayq_core::OnFailure::Continue)
        .await
        .unwrap();
    let job = || {
        NewJob::new(&q, b"body".to_vec())
            .priority(-3)
            .max_attempts(7)
            .group("g|é {x}")
            .in_batch(batch.id, 4)
            .enqueued_by("tester; with \"quotes\"")
    };
    let plain = NewJob::new(&q, Vec::new()).priority(-2);
    let ids = b.enqueue(vec![job(), plain]).await.unwrap();
    let old = b.enqueue(vec![job()]).await.unwrap()[0].id;
    let fields: usize = raw
        .hdel(format!("{}:job:{}", b.queue_key(&q), old.0), "f")
        .await
        .unwrap();
    assert_eq!(fields, 1, "the job hash had the value");
    let got = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    // The grouped jobs take turns: the first of the group, then the plain job.
    let seen: Vec<_> = got.iter().map(|j| j.lease.job).collect();
    assert_eq!(seen, vec![ids[0].id, ids[1].id]);
    let fields = |j: &ClaimedJob| {
        (
            j.priority,
            j.max_attempts,
            j.group.clone(),
            j.batch,
            j.stage,
            j.enqueued_by.clone(),
            j.payload.clone(),
        )
    };
    let new = fields(&got[0]);
    assert_eq!(
        new,
        (
            -3,
            7,
            Some("g|é {x}".to_owned()),
            Some(batch.id),
            Some(4),
            Some("tester; with \"quotes\"".to_owned()),
            b"body".to_vec()
        )
    );
    assert_eq!(fields(&got[1]), (-2, 3, None, None, None, None, Vec::new()));
    // The old job is next in its group once the first one finished (the settle makes
    // it ready in the same script).
    b.settle_many(vec![relayq_core::Settle::complete(got[0].lease.clone())])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    let next = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].lease.job, old);
    assert_eq!(fields(&next[0]), new);
    // The claim stored the rebuilt value, so a retry's claim reads it.
    let kept: bool = raw
        .hexists(format!("{}:job:{}", b.queue_key(&q), old.0), "f")
        .await
        .unwrap();
    assert!(kept, "the claim did not store the rebuilt value");
}

/// A job stored without its fixed fields value and with a dedupe key is not taken
/// for a plain job: its completion frees its key (SPEC E3), as one stored now does.
async fn a_job_stored_without_the_fixed_fields_value_frees_its_dedupe_key(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("packeddk");
    let keyed = NewJob::new(&q, b"k".to_vec()).dedupe_key("key");
    let first = b.enqueue_one(keyed).await.unwrap().id;
    let fields: usize = raw
        .hdel(format!("{}:job:{}", b.queue_key(&q), first.0), "f")
        .await
        .unwrap();
    assert_eq!(fields, 1, "the job hash had the value");
    let got = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    assert_eq!(got.len(), 1);
    let settled = b
        .settle_many(vec![relayq_core::Settle::complete(got[0].lease.clone())])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(settled, Settled::Completed);
    assert_key_freed(&b, &q, first).await;
}

/// Asserts that dedupe key "key" of queue `q` is free again after job `held` finished:
/// a new job with it is stored, not deduplicated (SPEC E3).
async fn assert_key_freed(b: &RedisBackend, q: &str, held: relayq_core::JobId) {
    let next = b
        .enqueue_one(NewJob::new(q, b"k".to_vec()).dedupe_key("key"))
        .await
        .unwrap();
    assert!(
        !next.deduplicated && next.id != held,
        "the completed job kept its key: {next:?}"
    );
}

/// Settles one lease, for the verdict.
async fn settle_one(b: &RedisBackend, lease: &relayq_core::Lease) -> relayq_core::Result<Settled> {
    b.settle_many(vec![relayq_core::Settle::complete(lease.clone())])
        .await
        .unwrap()
        .remove(0)
}

/// Rewrites a running job's lease as an earlier version stored it: fields `tk` (token)
/// and `ex` (expiry, microseconds), no `ls`. The running index keeps the expiry.
async fn store_as_old_lease(
    b: &RedisBackend,
    raw: &mut redis::aio::MultiplexedConnection,
    lease: &relayq_core::Lease,
    expiry: chrono::DateTime<chrono::Utc>,
) {
    let base = b.queue_key(&lease.queue);
    let key = format!("{base}:job:{}", lease.job.0);
    let micros = expiry.timestamp_micros();
    let _: () = redis::pipe()
        .atomic()
        .hdel(&key, "ls")
        .hset_multiple(
            &key,
            &[
                ("tk", lease.token.0.to_string()),
                ("ex", micros.to_string()),
            ],
        )
        .zadd(format!("{base}:running"), lease.job.0, micros)
        .query_async(raw)
        .await
        .unwrap();
}

/// A lease written before leases were kept in one hash field (`ls`) still holds (SPEC
/// L1, L3): its heartbeat extends it, the running list shows the new expiry, a wrong
/// token is stale and the right one completes the job, once. The job has a dedupe key,
/// so the completion takes the path that frees it (SPEC E3).
async fn a_lease_stored_as_separate_fields_still_holds(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("oldlease");
    let keyed = NewJob::new(&q, b"x".to_vec()).dedupe_key("key");
    let id = b.enqueue_one(keyed).await.unwrap().id;
    let got = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    let lease = got[0].lease.clone();
    store_as_old_lease(&b, &mut raw, &lease, lease.expires_at).await;
    let until = b.heartbeat(&lease, LEASE * 2).await.unwrap();
    assert!(
        until > lease.expires_at,
        "the heartbeat did not extend the lease"
    );
    let running = b.running(&q).await.unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].lease_expires_at, until);
    let mut wrong = lease.clone();
    wrong.token = relayq_core::LeaseToken::random();
    let stale = settle_one(&b, &wrong).await;
    assert!(matches!(stale, Err(Error::StaleLease)), "got {stale:?}");
    assert!(matches!(
        b.heartbeat(&wrong, LEASE).await,
        Err(Error::StaleLease)
    ));
    assert_eq!(settle_one(&b, &lease).await.unwrap(), Settled::Completed);
    let again = settle_one(&b, &lease).await;
    assert!(matches!(again, Err(Error::StaleLease)), "got {again:?}");
    let info = b.job(&q, id).await.unwrap();
    assert_eq!(info.state, JobState::Succeeded);
    assert!(b.running(&q).await.unwrap().is_empty());
    assert_key_freed(&b, &q, id).await;
}

/// An expired lease written before `ls` existed is taken back by the next claim (SPEC
/// C5): the job is claimed again under a new lease, and the old token is stale for
/// settle and heartbeat.
async fn an_expired_lease_stored_as_separate_fields_is_claimed_again(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("oldexpired");
    let id = b
        .enqueue_one(NewJob::new(&q, b"x".to_vec()))
        .await
        .unwrap()
        .id;
    let old = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap()[0]
        .lease
        .clone();
    let past = chrono::Utc::now() - chrono::Duration::seconds(1);
    store_as_old_lease(&b, &mut raw, &old, past).await;
    let got = b
        .claim(ClaimRequest::new(&q, "w2", 5, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the expired job was not claimed again");
    let new = got[0].lease.clone();
    assert_eq!((new.job, new.attempt), (id, 2));
    let stale = settle_one(&b, &old).await;
    assert!(matches!(stale, Err(Error::StaleLease)), "got {stale:?}");
    assert!(matches!(
        b.heartbeat(&old, LEASE).await,
        Err(Error::StaleLease)
    ));
    assert_eq!(settle_one(&b, &new).await.unwrap(), Settled::Completed);
}

/// A heartbeat keeps what the lease says about its job: a job with a dedupe key,
/// heartbeated and then completed, frees its key (SPEC L3, E3).
async fn a_heartbeated_job_with_a_dedupe_key_frees_it_on_completion(url: String) {
    let (b, _raw) = setup(&url).await;
    let q = queue_name("hbkey");
    let keyed = NewJob::new(&q, b"k".to_vec()).dedupe_key("key");
    let first = b.enqueue_one(keyed).await.unwrap().id;
    let got = b.claim(ClaimRequest::new(&q, "w", 5, LEASE)).await.unwrap();
    b.heartbeat(&got[0].lease, LEASE * 2).await.unwrap();
    assert_eq!(
        settle_one(&b, &got[0].lease).await.unwrap(),
        Settled::Completed
    );
    assert_key_freed(&b, &q, first).await;
}

/// SPEC M3 on plain completions, which are indexed for pruning by a list in finishing
/// order: maintenance prunes those older than the retention from the list's head and
/// keeps the first younger one and all after it.
async fn plain_completions_are_pruned_oldest_first(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("donelist");
    let ids: Vec<_> = b
        .enqueue(jobs(&q, 3))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    // One claim and one settle each, so the list holds them in id order.
    for _ in 0..3 {
        let got = b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap();
        b.settle_many(vec![relayq_core::Settle::complete(got[0].lease.clone())])
            .await
            .unwrap()
            .remove(0)
            .unwrap();
    }
    // The first two finished two hours ago.
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let old = (secs - 7_200) * 1_000_000 + micros;
    for id in &ids[..2] {
        let _: () = raw
            .hset(format!("{}:job:{}", b.queue_key(&q), id.0), "fa", old)
            .await
            .unwrap();
    }
    let m = b.maintain(&q, Duration::from_secs(3_600)).await.unwrap();
    assert_eq!(m.pruned, 2);
    for id in &ids[..2] {
        assert!(matches!(b.job(&q, *id).await, Err(Error::NotFound { .. })));
    }
    assert_eq!(b.job(&q, ids[2]).await.unwrap().state, JobState::Succeeded);
    assert_eq!(
        b.maintain(&q, Duration::from_secs(3_600))
            .await
            .unwrap()
            .pruned,
        0
    );
    assert_eq!(b.maintain(&q, Duration::ZERO).await.unwrap().pruned, 1);
}

/// SPEC M3: while another pass over the queue holds the maintenance lock (the
/// documented key), `try_maintain` returns `None` and deletes nothing; once it is gone,
/// the pass runs and leaves no lock behind.
async fn try_maintain_skips_while_another_pass_holds_the_lock(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("m3lock");
    let ids = b.enqueue(jobs(&q, 2)).await.unwrap();
    for e in &ids {
        assert!(b.cancel_job(&q, e.id).await.unwrap());
    }
    let key = b.maintenance_lock_key(&q);
    let _: () = raw.set(&key, "someone-else").await.unwrap();
    let skipped = b.try_maintain(&q, Duration::ZERO).await.unwrap();
    assert_eq!(skipped, None, "a pass ran while another held the lock");
    assert_eq!(
        b.queue_stats(&q).await.unwrap().total(),
        2,
        "jobs were pruned"
    );
    let held: Option<String> = raw.get(&key).await.unwrap();
    assert_eq!(
        held.as_deref(),
        Some("someone-else"),
        "the other holder's lock was touched"
    );
    let _: () = raw.del(&key).await.unwrap();
    let ran = b.try_maintain(&q, Duration::ZERO).await.unwrap();
    assert_eq!(
        ran.map(|m| m.pruned),
        Some(2),
        "the pass after the lock was freed"
    );
    let left: bool = raw.exists(&key).await.unwrap();
    assert!(!left, "the pass left its lock behind");
}

/// SPEC K12: a maintenance pass drops keys' rate values that lie in the past (the same
/// as none), and keeps a value still ahead.
async fn maintenance_drops_spent_key_rate_values(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("krprune");
    let fast = relayq_core::Rate::new(1000, Duration::from_secs(1));
    let slow = relayq_core::Rate::new(1, Duration::from_secs(3600));
    b.set_key_rate(&q, None, Some(fast)).await.unwrap();
    b.set_key_rate(&q, Some("own"), Some(slow)).await.unwrap();
    let keyed = ["a", "b", "own"].map(|k| NewJob::new(&q, b"x".to_vec()).limit_key(k));
    b.enqueue(keyed.to_vec()).await.unwrap();
    assert_eq!(
        b.claim(ClaimRequest::new(&q, "w", 10, LEASE))
            .await
            .unwrap()
            .len(),
        3
    );
    let key = format!("{}:{{{q}}}:ktat", support::PREFIX);
    let mut left: Vec<String> = raw.hkeys(&key).await.unwrap();
    left.sort();
    assert_eq!(left, ["a", "b", "own"]);
    // Under 1,000 a second a key's value is a millisecond ahead.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        b.maintain(&q, Duration::from_secs(3600)).await.unwrap();
        let left: Vec<String> = raw.hkeys(&key).await.unwrap();
        if left == ["own"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "values left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The members of B:ready per limit key, and each key's own index (B:kw:<key>), which
/// must hold exactly those.
async fn key_index_matches_ready(raw: &mut redis::aio::MultiplexedConnection, q: &str, step: &str) {
    let base = format!("{}:{{{q}}}", support::PREFIX);
    let ready: Vec<String> = raw.zrange(format!("{base}:ready"), 0, -1).await.unwrap();
    let mut by_key: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for m in ready {
        let id = m[18..].trim_start_matches('0').to_owned();
        let lk: Option<String> = raw.hget(format!("{base}:job:{id}"), "lk").await.unwrap();
        if let Some(lk) = lk {
            by_key.entry(lk).or_default().push(m);
        }
    }
    for k in ["a", "b", "c"] {
        let index: Vec<String> = raw.zrange(format!("{base}:kw:{k}"), 0, -1).await.unwrap();
        let want = by_key.remove(k).unwrap_or_default();
        assert_eq!(index, want, "{step}: key {k}'s index against B:ready");
    }
}

/// SPEC K4: an enqueue parks a new job behind 64 of its key's jobs in B:ready (a key of
/// limit 2: 100 jobs leave 64 claimable and 36 parked), and each key's index of its
/// jobs in B:ready stays exact through claims, parking, completions, retries, cancels
/// and a lifted limit (a member left behind would make an enqueue park a job with
/// nothing ahead to put it back).
async fn enqueue_parks_behind_a_keys_ready_jobs(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("kwait");
    b.set_key_limit(&q, Some("a"), Some(2)).await.unwrap();
    let base = format!("{}:{{{q}}}", support::PREFIX);
    let mut new: Vec<NewJob> = (0..100)
        .map(|_| NewJob::new(&q, b"x".to_vec()).limit_key("a"))
        .collect();
    new.extend((0..5).map(|_| NewJob::new(&q, b"x".to_vec()).limit_key("b")));
    new.extend((0..5).map(|_| NewJob::new(&q, b"x".to_vec()).limit_key("c")));
    b.enqueue(new).await.unwrap();
    let parked: usize = raw.zcard(format!("{base}:kp:a")).await.unwrap();
    assert_eq!(parked, 36, "jobs of key a parked at enqueue");
    key_index_matches_ready(&mut raw, &q, "after the enqueue").await;
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), 10, "a claim of 10");
    key_index_matches_ready(&mut raw, &q, "after a claim").await;
    let mut got = got.into_iter();
    let first = got.next().unwrap();
    b.complete(&first.lease).await.unwrap();
    let second = got.next().unwrap();
    b.fail(
        &second.lease,
        "again",
        relayq_core::Retry::After(Duration::ZERO),
    )
    .await
    .unwrap();
    key_index_matches_ready(&mut raw, &q, "after a complete and a retry").await;
    let waiting: Vec<String> = raw.zrange(format!("{base}:kw:c"), 0, 0).await.unwrap();
    let m = waiting.first().expect("key c has a job waiting");
    let id: i64 = m[18..].trim_start_matches('0').parse().unwrap();
    assert!(b.cancel_job(&q, relayq_core::JobId(id)).await.unwrap());
    let more = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    key_index_matches_ready(&mut raw, &q, "after a cancel and a claim").await;
    b.set_key_limit(&q, Some("a"), None).await.unwrap();
    key_index_matches_ready(&mut raw, &q, "after the limit was lifted").await;
    let unkeyed = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(unkeyed.len(), 10, "a claim of 10 without key limits");
    key_index_matches_ready(&mut raw, &q, "after a claim without key limits").await;
    // Two jobs fall due behind the others: a claim of one moves both into B:ready.
    let later = (0..2).map(|_| {
        NewJob::new(&q, b"x".to_vec())
            .limit_key("b")
            .delay(Duration::from_millis(20))
    });
    b.enqueue(later.collect()).await.unwrap();
    let mut fell_due = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        fell_due.extend(b.claim(ClaimRequest::new(&q, "w", 1, LEASE)).await.unwrap());
        let delayed: usize = raw.zcard(format!("{base}:delay")).await.unwrap();
        if delayed == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs never fell due"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    key_index_matches_ready(&mut raw, &q, "after jobs fell due").await;
    for j in got.chain(more).chain(unkeyed).chain(fell_due) {
        b.complete(&j.lease).await.unwrap();
    }
    key_index_matches_ready(&mut raw, &q, "after the completions").await;
}

/// SPEC K4: members of a key's index that are no longer in B:ready (left there by an
/// earlier version's scripts on the same server) park nothing: an enqueue behind 64 of
/// them drops the one it checks and leaves its job claimable, where parking it would
/// leave it with nothing to put it back.
async fn stale_key_index_members_park_nothing(url: String) {
    let (b, mut raw) = setup(&url).await;
    let q = queue_name("kwstale");
    b.set_key_limit(&q, Some("a"), Some(1)).await.unwrap();
    let base = format!("{}:{{{q}}}", support::PREFIX);
    let stale: Vec<(i64, String)> = (1..=64)
        .map(|i| (0, format!("{:018}{:019}", 0, i)))
        .collect();
    let _: () = raw
        .zadd_multiple(format!("{base}:kw:a"), &stale)
        .await
        .unwrap();
    b.enqueue(vec![NewJob::new(&q, b"x".to_vec()).limit_key("a")])
        .await
        .unwrap();
    let parked: usize = raw.zcard(format!("{base}:kp:a")).await.unwrap();
    assert_eq!(parked, 0, "a job parked behind members not in B:ready");
    let left: usize = raw.zcard(format!("{base}:kw:a")).await.unwrap();
    assert_eq!(
        left, 64,
        "the stale member checked is dropped, the new job added"
    );
    let got = b
        .claim(ClaimRequest::new(&q, "w", 10, LEASE))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the new job is claimable");
}

relayq_conformance::server_tests! {
    server: relayq_conformance::harness::Server::of(&relayq_redis::DRIVER),
    tests: [
        enqueue_parks_behind_a_keys_ready_jobs,
        stale_key_index_members_park_nothing,
        maintenance_drops_spent_key_rate_values,
        try_maintain_skips_while_another_pass_holds_the_lock,
        order_is_exact_at_extremes,
        pruned_queue_returns_to_its_baseline,
        pruned_batches_return_to_the_baseline,
        pruned_groups_return_to_the_baseline,
        bad_prefix_and_unreachable_server_are_errors,
        jobs_stored_without_the_fixed_fields_value_claim_the_same,
        a_job_stored_without_the_fixed_fields_value_frees_its_dedupe_key,
        a_lease_stored_as_separate_fields_still_holds,
        an_expired_lease_stored_as_separate_fields_is_claimed_again,
        a_heartbeated_job_with_a_dedupe_key_frees_it_on_completion,
        plain_completions_are_pruned_oldest_first,
    ],
}
