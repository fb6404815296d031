//! SPEC X — errors and bad input.

use std::time::Duration;

use anyhow::ensure;
use relayq_core::{
    Batch, BatchId, ClaimRequest, CompleteExt, EnqueueExt, Error, JobId, JobState, NewJob,
    OnFailure, OrderBarrierExt, Retry, WaitFor, validate::MAX_JOBS_PER_ENQUEUE,
};

use super::support::{
    LEASE, claim, claim_as, claim_exactly, claim_nothing, enqueue, enqueue_all, expect_invalid,
    expect_state, total,
};
use crate::{Env, queue_name};

/// Hostile text that must be stored verbatim where free text is allowed (SPEC X2).
const HOSTILE: [&str; 8] = [
    "'; DROP TABLE x;--",
    "]",
    "{a}",
    "}",
    "--",
    "\" OR 1=1 --",
    "redis.call('FLUSHALL')",
    // Looks like a separator a reader might use inside a reply.
    "--log--",
];

/// SPEC X1: each error kind comes out of the call that should produce it, as the
/// variant the suite can match on.
pub async fn x1_error_kinds_are_distinct(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("x1");
    let res = b.claim(ClaimRequest::new(&q, "w", 0, LEASE)).await;
    ensure!(
        matches!(&res, Err(Error::InvalidInput { field: "limit", reason }) if !reason.is_empty()),
        "limit 0: expected InvalidInput on limit with a reason, got {res:?}"
    );
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec())).await?;
    let job = claim_exactly(b, &q, &[id]).await?.remove(0);
    b.complete(&job.lease).await?;
    let res = b.complete(&job.lease).await;
    ensure!(
        matches!(res, Err(Error::StaleLease)),
        "second complete: expected StaleLease, got {res:?}"
    );
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    enqueue(b, NewJob::new(&q, b"s".to_vec()).in_batch(batch.id, 3)).await?;
    let res = b
        .enqueue_one(NewJob::new(&q, b"s".to_vec()).in_batch(batch.id, 2))
        .await;
    ensure!(
        matches!(
            res,
            Err(Error::StageClosed {
                stage: 2,
                released: 3
            })
        ),
        "stage 2 below released 3: expected StageClosed, got {res:?}"
    );
    let res = b.job(&q, JobId(i64::MAX - 7)).await;
    ensure!(
        matches!(res, Err(Error::NotFound { .. })),
        "unknown job: expected NotFound, got {res:?}"
    );
    let res = b
        .wait(&batch, WaitFor::Stage(3), Duration::from_millis(150))
        .await;
    ensure!(
        matches!(res, Err(Error::Timeout { .. })),
        "unreached wait: expected Timeout, got {res:?}"
    );
    Ok(())
}

/// SPEC X2: hostile queue names are `InvalidInput` on `queue` on every call that takes
/// a queue, before anything is done.
pub async fn x2_hostile_queue_names_rejected(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let long = "q".repeat(10_000);
    let names = [
        "'; DROP TABLE x;--",
        "]",
        "{a}",
        "a\0b",
        "a b",
        "\u{e9}",
        "",
        ".",
        "..",
        long.as_str(),
    ];
    let hour = Duration::from_secs(3600);
    for name in names {
        let what = |call: &str| {
            format!(
                "{call} with queue {:?}",
                name.chars().take(40).collect::<String>()
            )
        };
        expect_invalid(
            b.enqueue(vec![NewJob::new(name, b"x".to_vec())]).await,
            "queue",
            &what("enqueue"),
        )?;
        expect_invalid(
            b.claim(ClaimRequest::new(name, "w", 1, LEASE)).await,
            "queue",
            &what("claim"),
        )?;
        expect_invalid(b.queue_stats(name).await, "queue", &what("queue_stats"))?;
        expect_invalid(b.job(name, JobId(1)).await, "queue", &what("job"))?;
        expect_invalid(b.running(name).await, "queue", &what("running"))?;
        expect_invalid(b.dead_jobs(name, 10).await, "queue", &what("dead_jobs"))?;
        expect_invalid(
            b.open_batch(name, OnFailure::Halt).await,
            "queue",
            &what("open_batch"),
        )?;
        expect_invalid(b.pause(name).await, "queue", &what("pause"))?;
        expect_invalid(b.resume(name).await, "queue", &what("resume"))?;
        expect_invalid(
            b.set_max_running(name, Some(1)).await,
            "queue",
            &what("set_max_running"),
        )?;
        expect_invalid(
            b.cancel_job(name, JobId(1)).await,
            "queue",
            &what("cancel_job"),
        )?;
        expect_invalid(b.retry_dead(name, None).await, "queue", &what("retry_dead"))?;
        expect_invalid(b.maintain(name, hour).await, "queue", &what("maintain"))?;
        expect_invalid(
            b.try_maintain(name, hour).await,
            "queue",
            &what("try_maintain"),
        )?;
        let batch = Batch {
            queue: name.to_owned(),
            id: BatchId(1),
        };
        expect_invalid(b.seal(&batch).await, "queue", &what("seal"))?;
        expect_invalid(
            b.batch_progress(&batch).await,
            "queue",
            &what("batch_progress"),
        )?;
        expect_invalid(
            b.batch_jobs(&batch, None, 10).await,
            "queue",
            &what("batch_jobs"),
        )?;
    }
    Ok(())
}

/// SPEC X2: hostile groups, dedupe keys, `enqueued_by`, workers, error texts and
/// payloads are stored verbatim and read back identical; they still group and dedupe.
pub async fn x2_hostile_text_stored_verbatim(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("x2text");
    let quotes = "'\"`".repeat(3400).into_bytes();
    let mut payloads: Vec<Vec<u8>> = HOSTILE.iter().map(|s| s.as_bytes().to_vec()).collect();
    payloads.extend([quotes, vec![0, 0xff, 0xfe, b'\'', 0], b"\\x00\\'".to_vec()]);
    let mut jobs = Vec::new();
    for (i, payload) in payloads.iter().enumerate() {
        let text = HOSTILE[i % HOSTILE.len()];
        jobs.push(
            NewJob::new(&q, payload.clone())
                .group(text)
                .dedupe_key(format!("{text}{i}"))
                .enqueued_by(text),
        );
    }
    let ids = enqueue_all(b, jobs).await?;
    for (i, id) in ids.iter().enumerate() {
        let info = b.job(&q, *id).await?;
        let text = HOSTILE[i % HOSTILE.len()];
        ensure!(
            info.payload == payloads[i],
            "payload {i} did not read back identical"
        );
        ensure!(
            info.group.as_deref() == Some(text)
                && info.dedupe_key.as_deref() == Some(format!("{text}{i}").as_str())
                && info.enqueued_by.as_deref() == Some(text),
            "hostile text of job {i} changed: group {:?} key {:?} by {:?}",
            info.group,
            info.dedupe_key,
            info.enqueued_by
        );
    }
    let again = b
        .enqueue_one(NewJob::new(&q, b"dup".to_vec()).dedupe_key(format!("{}0", HOSTILE[0])))
        .await?;
    ensure!(
        again.deduplicated && again.id == ids[0],
        "a hostile dedupe key did not deduplicate: {again:?}"
    );
    let worker = HOSTILE[0];
    let got = claim_as(b, &q, worker, 100, LEASE).await?;
    let heads = HOSTILE.len();
    ensure!(
        got.len() == heads,
        "expected one head per hostile group ({heads}), got {}",
        got.len()
    );
    for job in &got {
        let i = ids
            .iter()
            .position(|id| *id == job.id())
            .unwrap_or(usize::MAX);
        ensure!(
            i < heads,
            "claimed job {} is not the head of its group",
            job.id()
        );
        ensure!(
            job.payload == payloads[i] && job.group.as_deref() == Some(HOSTILE[i]),
            "claimed job {i} changed"
        );
        let error = HOSTILE[(i + 1) % heads];
        b.fail(&job.lease, error, Retry::Never).await?;
        let info = b.job(&q, job.id()).await?;
        ensure!(
            info.last_error.as_deref() == Some(error),
            "hostile error text changed: {:?}",
            info.last_error
        );
        ensure!(
            info.attempt_log[0].worker == worker,
            "hostile worker name changed: {:?}",
            info.attempt_log[0].worker
        );
    }
    Ok(())
}

/// SPEC X2, E4: labels with control characters or over 255 bytes are `InvalidInput`
/// naming the field; nothing of the call is stored.
pub async fn x2_bad_labels_rejected(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("x2labels");
    let long = "g".repeat(10_000);
    let job = || NewJob::new(&q, b"x".to_vec());
    for (field, bad) in [
        ("group", job().group("a\0b")),
        ("group", job().group(long.clone())),
        ("dedupe_key", job().dedupe_key("a\0b")),
        ("enqueued_by", job().enqueued_by(long.clone())),
    ] {
        expect_invalid(
            b.enqueue(vec![job(), bad]).await,
            field,
            &format!("a {field} with NUL or 10 kB"),
        )?;
    }
    expect_invalid(
        b.claim(ClaimRequest::new(&q, "w\0", 1, LEASE)).await,
        "worker",
        "worker with NUL",
    )?;
    expect_invalid(
        b.claim(ClaimRequest::new(&q, long.as_str(), 1, LEASE))
            .await,
        "worker",
        "10 kB worker",
    )?;
    ensure!(total(b, &q).await? == 0, "rejected calls stored jobs");
    Ok(())
}

/// SPEC X3, E1: calls that fail leave nothing half done: an oversized enqueue stores
/// nothing, a rejected enqueue takes no dedupe key, and no job is held twice.
pub async fn x3_failed_calls_leave_nothing_behind(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("x3");
    let too_many = (0..=MAX_JOBS_PER_ENQUEUE)
        .map(|_| NewJob::new(&q, b"x".to_vec()))
        .collect();
    expect_invalid(b.enqueue(too_many).await, "jobs", "10,001 jobs in one call")?;
    ensure!(total(b, &q).await? == 0, "an oversized call stored jobs");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let held = enqueue(b, NewJob::new(&q, b"s5".to_vec()).in_batch(batch.id, 5)).await?;
    let res = b
        .enqueue(vec![
            NewJob::new(&q, b"plain".to_vec()).dedupe_key("k"),
            NewJob::new(&q, b"low".to_vec()).in_batch(batch.id, 1),
        ])
        .await;
    ensure!(
        matches!(res, Err(Error::StageClosed { .. })),
        "expected StageClosed, got {res:?}"
    );
    ensure!(
        total(b, &q).await? == 1,
        "a rejected call stored some of its jobs"
    );
    let fresh = b
        .enqueue_one(NewJob::new(&q, b"k".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        !fresh.deduplicated,
        "a rejected call left its dedupe key taken"
    );
    let got = claim(b, &q, 10).await?;
    ensure!(
        got.len() == 2,
        "expected both jobs claimable, got {}",
        got.len()
    );
    claim_nothing(&*env.connect().await?, &q, "both jobs are held").await?;
    for job in &got {
        b.complete(&job.lease).await?;
    }
    expect_state(b, &q, held, JobState::Succeeded).await
}

/// SPEC X1: a handle opened without migrating on a namespace nobody migrated is refused
/// with `ErrorKind::Schema` (state missing) saying to migrate, and creates nothing: a
/// second such open finds it missing too.
pub async fn x1_a_missing_schema_is_a_schema_error(env: &Env) -> anyhow::Result<()> {
    for attempt in ["first", "second"] {
        let Some(res) = env.open_unmigrated().await else {
            anyhow::bail!("the subject declares Schema but its Env has no with_unmigrated");
        };
        let Err(e) = res else {
            anyhow::bail!("the {attempt} open of an unmigrated namespace succeeded");
        };
        ensure!(
            matches!(
                e,
                relayq_core::Error::Schema {
                    state: relayq_core::SchemaState::Missing,
                    ..
                }
            ),
            "the {attempt} open gave {e:?}, expected a Schema error (missing)"
        );
        ensure!(
            e.kind() == relayq_core::ErrorKind::Schema && e.to_string().contains("migrate()"),
            "the message should say to migrate: {e}"
        );
    }
    Ok(())
}

/// SPEC X4: a server that cannot be reached is reported within a few seconds, as a
/// transient error (the same call may succeed later), with its cause and without the
/// password of the URL.
pub async fn x4_unreachable_server_is_transient_quick_and_masked(env: &Env) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let Some(res) = env.open_unreachable().await else {
        anyhow::bail!("the subject declares Unreachable but its Env has no with_unreachable");
    };
    let took = start.elapsed();
    let Err(e) = res else {
        anyhow::bail!("a handle against a refused port opened without an error");
    };
    ensure!(
        took < std::time::Duration::from_secs(6),
        "reported after {took:?}: {e}"
    );
    ensure!(
        e.is_transient() && e.kind() == relayq_core::ErrorKind::Transient,
        "expected a transient error, got {:?}: {e:?}",
        e.kind()
    );
    let shown = format!("{e} {e:?}");
    ensure!(
        !shown.contains(crate::UNREACHABLE_PASSWORD),
        "the password shows: {shown}"
    );
    Ok(())
}
