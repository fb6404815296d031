//! SPEC E — enqueue.

use std::time::Duration;

use anyhow::ensure;
use relayq_core::{EnqueueExt, JobState, NewJob, validate::DEFAULT_MAX_PAYLOAD};
use tokio::time::Instant;

use super::support::{
    LEASE, PATIENCE, TIME_SLACK, claim, claim_nothing, claimed_at, complete_all, enqueue,
    enqueue_all, enqueue_n, expect_invalid, expect_state, total,
};
use crate::{Env, poll_until, queue_name};

/// SPEC E1: ids come back in input order, increasing, also across calls.
pub async fn e1_returns_ids_in_order(env: &Env) -> anyhow::Result<()> {
    let q = queue_name("e1");
    let jobs = (0..5).map(|i| NewJob::new(&q, vec![i])).collect();
    let out = env.backend().enqueue(jobs).await?;
    ensure!(out.len() == 5, "expected 5 ids, got {}", out.len());
    ensure!(
        out.windows(2).all(|w| w[0].id < w[1].id),
        "ids not increasing: {out:?}"
    );
    ensure!(out.iter().all(|e| !e.deduplicated));
    let later = enqueue_n(env.backend(), &q, 3).await?;
    ensure!(
        later[0] > out[4].id,
        "a later call got id {} after {}",
        later[0],
        out[4].id
    );
    for (i, e) in out.iter().enumerate() {
        let info = env.backend().job(&q, e.id).await?;
        ensure!(
            info.payload == vec![u8::try_from(i)?],
            "job {} holds the payload of another input",
            e.id
        );
    }
    ensure!(
        total(env.backend(), &q).await? == 8,
        "expected 8 jobs stored"
    );
    Ok(())
}

/// SPEC E1, E4: a call with one invalid job stores none of its valid jobs.
pub async fn e1_invalid_job_stores_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e1atomic");
    let mut jobs: Vec<_> = (0..3)
        .map(|i| NewJob::new(&q, vec![i]).dedupe_key(format!("k{i}")))
        .collect();
    jobs.push(NewJob::new(&q, b"bad".to_vec()).max_attempts(0));
    expect_invalid(
        b.enqueue(jobs).await,
        "max_attempts",
        "enqueue with one bad job",
    )?;
    ensure!(
        total(b, &q).await? == 0,
        "valid jobs of a rejected call were stored"
    );
    // The dedupe keys of the rejected call were not taken either.
    let again = b
        .enqueue_one(NewJob::new(&q, b"x".to_vec()).dedupe_key("k0"))
        .await?;
    ensure!(
        !again.deduplicated,
        "a rejected call left its dedupe key behind"
    );
    Ok(())
}

/// SPEC E2: a job with `run_at` in the future is not claimable before then.
pub async fn e2_future_job_waits_for_run_at(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e2");
    let delay = Duration::from_millis(600);
    let t0 = Instant::now();
    let id = enqueue(b, NewJob::new(&q, b"later".to_vec()).delay(delay)).await?;
    claim_nothing(b, &q, "its run_at is 600 ms ahead").await?;
    expect_state(b, &q, id, JobState::Scheduled).await?;
    let job = poll_until("the delayed job to become claimable", PATIENCE, || async {
        Ok(claim(b, &q, 1).await?.pop())
    })
    .await?;
    ensure!(job.id() == id, "claimed {} instead of {id}", job.id());
    let waited = t0.elapsed();
    ensure!(
        waited >= Duration::from_millis(500),
        "claimed after {waited:?}, before its run_at"
    );
    let at = claimed_at(&job, LEASE);
    ensure!(
        at + TIME_SLACK >= job.run_at,
        "claimed at server time {at}, before run_at {}",
        job.run_at
    );
    Ok(())
}

/// SPEC E3: a second enqueue with the key of an unfinished job returns that job's id,
/// flagged, and stores nothing; within one call too; other queues are independent.
pub async fn e3_dedupe_returns_existing_job(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e3");
    let first = b
        .enqueue_one(NewJob::new(&q, b"1".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        !first.deduplicated,
        "the first job with the key came back deduplicated"
    );
    let second = b
        .enqueue_one(NewJob::new(&q, b"2".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        second.id == first.id && second.deduplicated,
        "second enqueue with the key gave {second:?}, expected id {} flagged",
        first.id
    );
    let call = b
        .enqueue(vec![
            NewJob::new(&q, b"3".to_vec()).dedupe_key("m"),
            NewJob::new(&q, b"4".to_vec()).dedupe_key("m"),
            NewJob::new(&q, b"5".to_vec()).dedupe_key("k"),
        ])
        .await?;
    ensure!(
        !call[0].deduplicated && call[1].id == call[0].id && call[1].deduplicated,
        "same key twice in one call gave {call:?}"
    );
    ensure!(
        call[2].id == first.id && call[2].deduplicated,
        "key held by an earlier call gave {:?}",
        call[2]
    );
    ensure!(
        total(b, &q).await? == 2,
        "expected 2 jobs stored, got {}",
        total(b, &q).await?
    );
    let info = b.job(&q, first.id).await?;
    ensure!(
        info.payload == b"1",
        "deduplication changed the stored job's payload"
    );
    let other = queue_name("e3other");
    let there = b
        .enqueue_one(NewJob::new(&other, b"o".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        !there.deduplicated,
        "a dedupe key of another queue deduplicated"
    );
    Ok(())
}

/// SPEC E3: once the job holding a key is finished (succeeded or cancelled), a new job
/// with the key is stored.
pub async fn e3_finished_job_frees_its_key(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e3free");
    let first = enqueue(b, NewJob::new(&q, b"1".to_vec()).dedupe_key("k")).await?;
    complete_all(b, &q, &[first]).await?;
    let second = b
        .enqueue_one(NewJob::new(&q, b"2".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        !second.deduplicated && second.id != first,
        "after the holder succeeded, enqueue gave {second:?}"
    );
    ensure!(
        b.cancel_job(&q, second.id).await?,
        "cancel of a ready job returned false"
    );
    let third = b
        .enqueue_one(NewJob::new(&q, b"3".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        !third.deduplicated && third.id != second.id,
        "after the holder was cancelled, enqueue gave {third:?}"
    );
    ensure!(total(b, &q).await? == 3, "expected 3 jobs stored");
    Ok(())
}

/// SPEC E4, X2: each invalid field of a job is `InvalidInput` naming it; nothing stored.
pub async fn e4_invalid_jobs_name_the_field(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e4");
    let job = || NewJob::new(&q, b"x".to_vec());
    let cases: Vec<(&str, NewJob)> = vec![
        ("payload", NewJob::new(&q, vec![0; DEFAULT_MAX_PAYLOAD + 1])),
        ("max_attempts", job().max_attempts(0)),
        ("max_attempts", job().max_attempts(1001)),
        ("stage", job().stage(1)),
        ("group", job().group("a\0b")),
        ("group", job().group("g".repeat(10_000))),
        ("group", job().group("")),
        ("dedupe_key", job().dedupe_key("k\0")),
        ("dedupe_key", job().dedupe_key("k".repeat(10_000))),
        ("enqueued_by", job().enqueued_by("line\nbreak")),
        (
            "run_at",
            job().delay(Duration::from_secs(200 * 365 * 24 * 3600)),
        ),
    ];
    for (field, bad) in cases {
        let what = format!("job with bad {field}");
        expect_invalid(b.enqueue(vec![job(), bad]).await, field, &what)?;
    }
    for name in ["", "a b", "é", "q/1", ".", "..", &"q".repeat(129)] {
        let what = format!("queue name {name:?}");
        expect_invalid(
            b.enqueue(vec![NewJob::new(name, b"x".to_vec())]).await,
            "queue",
            &what,
        )?;
    }
    let other = queue_name("e4other");
    let mixed = vec![job(), NewJob::new(&other, b"y".to_vec())];
    expect_invalid(
        b.enqueue(mixed).await,
        "queue",
        "jobs of two queues in one call",
    )?;
    ensure!(
        total(b, &q).await? == 0,
        "a rejected call stored jobs in {q}"
    );
    ensure!(
        total(b, &other).await? == 0,
        "a rejected call stored jobs in {other}"
    );
    Ok(())
}

/// SPEC E4: the payload limit is inclusive (exactly 1 MiB is stored), and an empty
/// payload is allowed; both read back identical.
pub async fn e4_payload_limit_is_inclusive(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("e4payload");
    let big: Vec<u8> = (0..DEFAULT_MAX_PAYLOAD).map(|i| (i % 251) as u8).collect();
    let ids = enqueue_all(
        b,
        vec![NewJob::new(&q, big.clone()), NewJob::new(&q, Vec::new())],
    )
    .await?;
    ensure!(
        b.job(&q, ids[0]).await?.payload == big,
        "the 1 MiB payload did not read back identical"
    );
    ensure!(
        b.job(&q, ids[1]).await?.payload.is_empty(),
        "the empty payload did not read back empty"
    );
    Ok(())
}
