//! SPEC M — monitoring and maintenance.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::ensure;
use relayq_core::{
    ClaimedJob, CompleteExt, DEFAULT_RETENTION, EnqueueExt, JobId, JobState, NewJob, OnFailure,
    Retry,
    worker::{JobError, Worker},
};

use super::support::{
    PATIENCE, claim, claim_exactly, enqueue, enqueue_n, expect_invalid, expect_not_found,
    expect_state, one_job_per_state, total,
};
use crate::{Env, poll_until, queue_name};

/// SPEC M1: `queue_stats` counts every job once in its state; `job` reads each job in
/// the same state; the pause flag and `max_running` show; an unused queue is all zero.
pub async fn m1_stats_count_each_state(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m1");
    let by_state = one_job_per_state(b, &q).await?;
    b.set_max_running(&q, Some(5)).await?;
    b.pause(&q).await?;
    let stats = b.queue_stats(&q).await?;
    for state in JobState::ALL {
        ensure!(
            stats.count(state) == 1,
            "expected 1 {state} job, stats say {}: {stats:?}",
            stats.count(state)
        );
        expect_state(b, &q, by_state[&state], state).await?;
    }
    ensure!(
        stats.total() == 8,
        "expected 8 jobs in all, stats say {}",
        stats.total()
    );
    ensure!(
        stats.paused && stats.max_running == Some(5),
        "settings not shown: {stats:?}"
    );
    let unused = b.queue_stats(&queue_name("m1unused")).await?;
    ensure!(
        unused.total() == 0 && !unused.paused && unused.max_running.is_none(),
        "an unused queue: {unused:?}"
    );
    Ok(())
}

/// SPEC M1: `job` returns every field as enqueued; an unknown id, or one asked of
/// another queue, is `NotFound`.
pub async fn m1_job_reads_back_fields(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m1job");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let job = NewJob::new(&q, b"payload".to_vec())
        .priority(7)
        .max_attempts(9)
        .group("grp")
        .dedupe_key("key")
        .enqueued_by("me")
        .in_batch(batch.id, 4);
    let id = enqueue(b, job).await?;
    let info = b.job(&q, id).await?;
    ensure!(
        info.id == id
            && info.queue == q
            && info.state == JobState::Ready
            && info.payload == b"payload"
            && info.priority == 7
            && info.max_attempts == 9
            && info.attempts == 0
            && info.group.as_deref() == Some("grp")
            && info.dedupe_key.as_deref() == Some("key")
            && info.enqueued_by.as_deref() == Some("me")
            && info.batch == Some(batch.id)
            && info.stage == Some(4)
            && info.finished_at.is_none()
            && info.last_error.is_none()
            && info.attempt_log.is_empty()
            && info.created_at <= info.run_at,
        "job info differs from what was enqueued: {info:?}"
    );
    expect_not_found(b.job(&q, JobId(i64::MAX - 7)).await, "an unknown job id")?;
    expect_not_found(
        b.job(&queue_name("m1other"), id).await,
        "a job id asked of another queue",
    )?;
    Ok(())
}

/// SPEC M2: dead jobs are listed oldest first and retried: back to `ready` with
/// the enqueued attempts again, numbered on; only dead jobs move.
pub async fn m2_dead_jobs_listed_and_retried(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m2");
    let all = enqueue_n(b, &q, 3).await?;
    let got = claim_exactly(b, &q, &all).await?;
    b.fail(&got[0].lease, "first", Retry::Never).await?;
    b.fail(&got[1].lease, "second", Retry::Never).await?;
    b.complete(&got[2].lease).await?;
    let dead: Vec<_> = b
        .dead_jobs(&q, 10)
        .await?
        .into_iter()
        .map(|j| (j.id, j.last_error))
        .collect();
    ensure!(
        dead == [
            (all[0], Some("first".into())),
            (all[1], Some("second".into()))
        ],
        "dead_jobs listed {dead:?}"
    );
    let limited = b.dead_jobs(&q, 1).await?;
    ensure!(
        limited.len() == 1 && limited[0].id == all[0],
        "dead_jobs with limit 1: {limited:?}"
    );
    let n = b.retry_dead(&q, Some(&[all[0], all[2]])).await?;
    ensure!(
        n == 1,
        "retry_dead of one dead and one succeeded job moved {n}"
    );
    // Enqueued with the default budget, dead after one attempt (Retry::Never): the
    // retry keeps the attempt spent and adds the budget on top.
    let info = b.job(&q, all[0]).await?;
    let budget = u32::from(relayq_core::DEFAULT_MAX_ATTEMPTS);
    ensure!(
        info.state == JobState::Ready
            && info.attempts == 1
            && u32::from(info.max_attempts) == 1 + budget,
        "retried job: {} attempts {} of {}",
        info.state,
        info.attempts,
        info.max_attempts
    );
    expect_state(b, &q, all[2], JobState::Succeeded).await?;
    let again = claim_exactly(b, &q, &all[..1]).await?;
    ensure!(
        again[0].attempt() == 2,
        "retried job claimed as attempt {}, not the next after 1",
        again[0].attempt()
    );
    // Dead again, retried again: the budget grows by the enqueued one, not by what
    // max_attempts had become.
    b.fail(&again[0].lease, "third", Retry::Never).await?;
    ensure!(
        b.retry_dead(&q, Some(&all[..1])).await? == 1,
        "second retry of the same job"
    );
    let info = b.job(&q, all[0]).await?;
    ensure!(
        info.attempts == 2 && u32::from(info.max_attempts) == 2 + budget,
        "twice-retried job: attempts {} of {}",
        info.attempts,
        info.max_attempts
    );
    let numbers: Vec<u32> = info.attempt_log.iter().map(|a| a.attempt).collect();
    ensure!(numbers == [1, 2], "attempt log numbered {numbers:?}");
    // Released, it is as before its claim: ready, since the attempts spent before the
    // retry do not count (SPEC L4).
    let third = claim_exactly(b, &q, &all[..1]).await?;
    ensure!(
        third[0].attempt() == 3,
        "claimed as attempt {}",
        third[0].attempt()
    );
    b.release(&third[0].lease).await?;
    expect_state(b, &q, all[0], JobState::Ready).await?;
    let n = b.retry_dead(&q, None).await?;
    ensure!(
        n == 1,
        "retry_dead of the whole queue moved {n}, expected 1"
    );
    ensure!(
        b.dead_jobs(&q, 10).await?.is_empty(),
        "dead jobs left after retrying all"
    );
    Ok(())
}

/// SPEC M1, B1, B5: `batches` lists a queue's batches newest first, each with the same
/// progress `batch_progress` reports, its name included; a bad limit or name is
/// rejected.
pub async fn m1_batches_lists_newest_first(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m1batches");
    let mut opened = Vec::new();
    for stage in [100, 200, 300] {
        let batch = if stage == 200 {
            b.open_named_batch(&q, OnFailure::Continue, "nightly 'load' ✓")
                .await?
        } else {
            b.open_batch(&q, OnFailure::Continue).await?
        };
        enqueue(b, NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, stage)).await?;
        opened.push(batch);
    }
    b.seal(&opened[1]).await?;
    let names: Vec<Option<String>> = {
        let mut names = Vec::new();
        for batch in &opened {
            names.push(b.batch_progress(batch).await?.name);
        }
        names
    };
    ensure!(
        names == [None, Some("nightly 'load' ✓".to_owned()), None],
        "batch names read back as {names:?}"
    );
    for bad in ["", "a\nb"] {
        expect_invalid(
            b.open_named_batch(&q, OnFailure::Continue, bad).await,
            "name",
            "a batch with a bad name",
        )?;
    }
    let listed = b.batches(&q, 2).await?;
    let want = [
        b.batch_progress(&opened[2]).await?,
        b.batch_progress(&opened[1]).await?,
    ];
    ensure!(
        listed == want,
        "batches(q, 2) gave {listed:?}, expected {want:?}"
    );
    ensure!(
        b.batches(&queue_name("m1none"), 10).await?.is_empty(),
        "an unused queue has no batches"
    );
    for bad in [0, 1001] {
        expect_invalid(
            b.batches(&q, bad).await,
            "limit",
            "batches with a bad limit",
        )?;
    }
    Ok(())
}

/// SPEC M2, E3: of two dead jobs sharing a dedupe key, `retry_dead` brings back only
/// the first, and the key is then held again.
pub async fn m2_retry_dead_revives_one_job_per_dedupe_key(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m2key");
    let mut dead = Vec::new();
    for _ in 0..2 {
        // The first job is dead (finished) when the second comes, so the key is free.
        let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).dedupe_key("k")).await?;
        let job = claim_exactly(b, &q, &[id]).await?.remove(0);
        b.fail(&job.lease, "boom", Retry::Never).await?;
        dead.push(id);
    }
    let revived = b.retry_dead(&q, None).await?;
    ensure!(
        revived == 1,
        "retry_dead revived {revived} jobs sharing one key"
    );
    expect_state(b, &q, dead[0], JobState::Ready).await?;
    expect_state(b, &q, dead[1], JobState::Dead).await?;
    let again = b
        .enqueue_one(NewJob::new(&q, b"y".to_vec()).dedupe_key("k"))
        .await?;
    ensure!(
        again.deduplicated && again.id == dead[0],
        "the revived job should hold the key again: {again:?}"
    );
    Ok(())
}

/// SPEC M2, B2: `retry_dead` leaves jobs of a batch dead (reviving one would run it
/// after later stages started).
pub async fn m2_retry_dead_leaves_batch_jobs(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m2batch");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let id = enqueue(b, NewJob::new(&q, b"x".to_vec()).in_batch(batch.id, 1)).await?;
    let got = claim_exactly(b, &q, &[id]).await?;
    b.fail(&got[0].lease, "fatal", Retry::Never).await?;
    let n = b.retry_dead(&q, None).await?;
    ensure!(n == 0, "retry_dead revived {n} batch jobs");
    expect_state(b, &q, id, JobState::Dead).await
}

/// SPEC M3: maintenance prunes finished jobs older than the retention, and never
/// touches unfinished jobs.
pub async fn m3_maintain_prunes_only_finished(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m3");
    let by_state = one_job_per_state(b, &q).await?;
    let m = b.maintain(&q, DEFAULT_RETENTION).await?;
    ensure!(
        m.pruned == 0 && m.requeued == 0 && m.dead == 0,
        "maintain with 7-day retention did {m:?}"
    );
    ensure!(total(b, &q).await? == 8, "the 7-day maintain removed jobs");
    let pruned = AtomicU64::new(0);
    poll_until(
        "maintain to prune the 3 finished jobs",
        PATIENCE,
        || async {
            let m = b.maintain(&q, Duration::ZERO).await?;
            ensure!(
                m.requeued == 0 && m.dead == 0,
                "maintain touched running jobs: {m:?}"
            );
            Ok((pruned.fetch_add(m.pruned, Ordering::SeqCst) + m.pruned >= 3).then_some(()))
        },
    )
    .await?;
    let pruned = pruned.into_inner();
    ensure!(
        pruned == 3,
        "maintain pruned {pruned} jobs, 3 were finished"
    );
    for (state, id) in &by_state {
        if state.is_finished() {
            expect_not_found(b.job(&q, *id).await, "a pruned job")?;
        } else {
            expect_state(b, &q, *id, *state).await?;
        }
    }
    ensure!(
        total(b, &q).await? == 5,
        "expected the 5 unfinished jobs to remain"
    );
    ensure!(
        claim(b, &q, 10).await?.len() == 1,
        "the ready job should still be claimable"
    );
    Ok(())
}

/// SPEC M3: `try_maintain` does what `maintain` does when no other pass runs.
pub async fn m3_try_maintain_prunes_when_free(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m3try");
    let by_state = one_job_per_state(b, &q).await?;
    let pruned = AtomicU64::new(0);
    poll_until(
        "try_maintain to prune the 3 finished jobs",
        PATIENCE,
        || async {
            let Some(m) = b.try_maintain(&q, Duration::ZERO).await? else {
                anyhow::bail!("try_maintain skipped a queue no other pass holds");
            };
            Ok((pruned.fetch_add(m.pruned, Ordering::SeqCst) + m.pruned >= 3).then_some(()))
        },
    )
    .await?;
    for (state, id) in &by_state {
        if !state.is_finished() {
            expect_state(b, &q, *id, *state).await?;
        }
    }
    ensure!(
        total(b, &q).await? == 5,
        "expected the 5 unfinished jobs to remain"
    );
    Ok(())
}

/// SPEC M3, W1: a worker runs the maintenance pass on a timer: finished jobs past the
/// retention disappear while it runs, and an unfinished (delayed) job stays.
pub async fn m3_workers_prune_on_a_timer(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m3timer");
    let waiting = enqueue(
        b,
        NewJob::new(&q, b"later".to_vec()).delay(Duration::from_secs(3600)),
    )
    .await?;
    enqueue_n(b, &q, 20).await?;
    let worker = Worker::builder(env.connect().await?, [q.clone()])
        .handler(|_job: ClaimedJob| async { Ok::<_, JobError>(()) })
        .maintenance(Duration::from_millis(100), Duration::ZERO)
        .build()?
        .spawn();
    let pruned = poll_until(
        "the worker to prune its 20 finished jobs",
        PATIENCE,
        || async {
            let stats = b.queue_stats(&q).await?;
            Ok((stats.total() == 1).then_some(stats))
        },
    )
    .await;
    let report = worker.shutdown().await?;
    let stats = pruned?;
    ensure!(
        stats.count(JobState::Scheduled) == 1,
        "the delayed job should be all that is left: {stats:?}"
    );
    expect_state(b, &q, waiting, JobState::Scheduled).await?;
    ensure!(
        report.succeeded == 20,
        "the worker should have run the 20 jobs: {report:?}"
    );
    Ok(())
}

/// SPEC M4: `queues` lists every queue holding a job, a batch or a setting, sorted and
/// once each, and not a queue that was only looked at.
pub async fn m4_queues_lists_queues_in_use(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let with_job = queue_name("m4job");
    let with_batch = queue_name("m4batch");
    let paused = queue_name("m4paused");
    let limited = queue_name("m4limited");
    let looked_at = queue_name("m4looked");
    enqueue_n(b, &with_job, 2).await?;
    b.open_batch(&with_batch, OnFailure::Continue).await?;
    b.pause(&paused).await?;
    b.set_max_running(&limited, Some(2)).await?;
    b.queue_stats(&looked_at).await?;
    claim(b, &looked_at, 1).await?;
    // Queues whose only jobs are running, retrying, blocked behind their group, or
    // finished: each state may be stored apart.
    let running = queue_name("m4running");
    enqueue_n(b, &running, 1).await?;
    claim(b, &running, 1).await?;
    let retrying = queue_name("m4retrying");
    enqueue_n(b, &retrying, 1).await?;
    let job = claim(b, &retrying, 1).await?.remove(0);
    b.fail(&job.lease, "later", Retry::After(Duration::from_secs(3600)))
        .await?;
    let grouped = queue_name("m4grouped");
    for p in [b"a", b"b"] {
        enqueue(b, NewJob::new(&grouped, p.to_vec()).group("g")).await?;
    }
    claim(b, &grouped, 1).await?;
    let finished = queue_name("m4finished");
    enqueue_n(b, &finished, 1).await?;
    let job = claim(b, &finished, 1).await?.remove(0);
    b.complete(&job.lease).await?;
    let names = b.queues().await?;
    for q in [
        &with_job,
        &with_batch,
        &paused,
        &limited,
        &running,
        &retrying,
        &grouped,
        &finished,
    ] {
        let n = names.iter().filter(|n| *n == q).count();
        ensure!(n == 1, "queue {q:?} is listed {n} times in {names:?}");
    }
    ensure!(
        !names.contains(&looked_at),
        "queue {looked_at:?} was only looked at, yet is listed"
    );
    ensure!(
        names.windows(2).all(|w| w[0] < w[1]),
        "queues are not sorted and distinct: {names:?}"
    );
    Ok(())
}

/// SPEC M5: `batch_jobs` lists every job of the batch once, in id order and in any
/// state (waiting on a later stage, running, finished), page by page, and none of
/// another batch or of no batch; an unknown batch, or one asked of another queue, is
/// `NotFound`; a bad limit is refused by name.
pub async fn m5_batch_jobs_lists_a_batch_page_by_page(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m5");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let other = b.open_batch(&q, OnFailure::Continue).await?;
    let mut mine = Vec::new();
    for (i, stage) in [0, 1, 0, 2, 1].into_iter().enumerate() {
        mine.push(
            enqueue(
                b,
                NewJob::new(&q, vec![b'a'; i + 1]).in_batch(batch.id, stage),
            )
            .await?,
        );
        enqueue(b, NewJob::new(&q, b"other".to_vec()).in_batch(other.id, 0)).await?;
        enqueue(b, NewJob::new(&q, b"plain".to_vec())).await?;
    }
    // Two of stage 0 run; one of them finishes.
    let mut running = Vec::new();
    while running.len() < 2 {
        let got = claim(b, &q, 1).await?;
        ensure!(!got.is_empty(), "nothing left to claim");
        if mine.contains(&got[0].lease.job) {
            running.push(got.into_iter().next().unwrap());
        }
    }
    b.complete(&running[0].lease).await?;

    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = b.batch_jobs(&batch, after, 2).await?;
        ensure!(page.len() <= 2, "a page of 2 held {}", page.len());
        let Some(last) = page.last().copied() else {
            break;
        };
        listed.extend(page);
        after = Some(last);
    }
    ensure!(
        listed == mine,
        "listed {listed:?}, the batch holds {mine:?}"
    );
    let whole = b.batch_jobs(&batch, None, 1000).await?;
    ensure!(
        whole == mine,
        "one page: {whole:?}, the batch holds {mine:?}"
    );

    let unknown = relayq_core::Batch {
        queue: q.clone(),
        id: relayq_core::BatchId(other.id.0 + 1_000_000),
    };
    expect_not_found(b.batch_jobs(&unknown, None, 10).await, "an unknown batch")?;
    let elsewhere = relayq_core::Batch {
        queue: queue_name("m5other"),
        id: batch.id,
    };
    expect_not_found(
        b.batch_jobs(&elsewhere, None, 10).await,
        "another queue's batch",
    )?;
    expect_invalid(b.batch_jobs(&batch, None, 0).await, "limit", "limit 0")?;
    expect_invalid(
        b.batch_jobs(&batch, None, 1001).await,
        "limit",
        "limit 1001",
    )?;
    Ok(())
}

/// SPEC M1: `oldest_ready` is the earliest `run_at` of the queue's due claimable jobs
/// (ready, or retrying and due), across priorities; a job not yet due or running does
/// not count, and with none waiting it is `None`.
pub async fn m1_oldest_ready_is_the_longest_wait(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m1old");
    let none = b.queue_stats(&q).await?.oldest_ready;
    ensure!(none.is_none(), "an unused queue: {none:?}");
    let first = enqueue(b, NewJob::new(&q, b"a".to_vec())).await?;
    // Enqueued later, in another priority band: not the oldest, whichever band a
    // claim takes first.
    enqueue(b, NewJob::new(&q, b"b".to_vec()).priority(-5)).await?;
    enqueue(
        b,
        NewJob::new(&q, b"c".to_vec()).delay(Duration::from_secs(3600)),
    )
    .await?;
    let first_at = b.job(&q, first).await?.run_at;
    let stats = b.queue_stats(&q).await?;
    ensure!(
        stats.oldest_ready == Some(first_at),
        "expected job {first}'s run_at {first_at}: {stats:?}"
    );
    let age = stats.oldest_ready_age(first_at + chrono::Duration::seconds(2));
    ensure!(age == Some(Duration::from_secs(2)), "age {age:?}");

    let running = claim(b, &q, 2).await?;
    ensure!(running.len() == 2, "claimed {running:?}");
    let waiting = b.queue_stats(&q).await?.oldest_ready;
    ensure!(
        waiting.is_none(),
        "two running and one scheduled job: nothing waits, got {waiting:?}"
    );
    // A retrying job whose time has come waits too, from its retry time.
    b.fail(
        &running[0].lease,
        "again",
        Retry::After(Duration::from_millis(1)),
    )
    .await?;
    let retry_at = b.job(&q, running[0].lease.job).await?.run_at;
    let stats = poll_until("the retry to fall due", PATIENCE, || async {
        let s = b.queue_stats(&q).await?;
        Ok(s.oldest_ready.is_some().then_some(s))
    })
    .await?;
    ensure!(
        stats.oldest_ready == Some(retry_at),
        "expected the retry time {retry_at}: {stats:?}"
    );
    Ok(())
}

/// SPEC M6: `why` names every rule holding a job back: `run_at`, a backoff, a lower
/// stage, the group's running job, a paused queue, `max_running`; and says when a job
/// runs, finished, or waits for a claim alone.
pub async fn m6_why_names_what_holds_a_job(env: &Env) -> anyhow::Result<()> {
    use relayq_core::{Hold, InspectExt, Why};
    let b = env.backend();
    let q = queue_name("m6");
    let later = enqueue(
        b,
        NewJob::new(&q, b"later".to_vec()).delay(Duration::from_secs(3600)),
    )
    .await?;
    let head = enqueue(b, NewJob::new(&q, b"head".to_vec()).group("g")).await?;
    let behind = enqueue(b, NewJob::new(&q, b"behind".to_vec()).group("g")).await?;
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let low = enqueue(b, NewJob::new(&q, b"low".to_vec()).in_batch(batch.id, 1)).await?;
    let high = enqueue(b, NewJob::new(&q, b"high".to_vec()).in_batch(batch.id, 2)).await?;
    let free = enqueue(b, NewJob::new(&q, b"free".to_vec())).await?;
    ensure!(
        b.why(&q, free).await? == Why::Claimable,
        "a ready job with nothing ahead waits for a claim alone"
    );
    let why = b.why(&q, later).await?;
    ensure!(
        matches!(&why, Why::Held(h) if matches!(h.as_slice(), [Hold::NotBefore(_)])),
        "a delayed job: {why:?}"
    );
    let why = b.why(&q, high).await?;
    ensure!(
        why == Why::Held(vec![Hold::Stage {
            batch: batch.id,
            stage: 2,
            waiting_for: 1,
            unfinished: 1
        }]),
        "a job behind a lower stage: {why:?}"
    );
    // Claim the group's head (and whatever else is ready): it holds the group.
    let got = claim(b, &q, 10).await?;
    let held = got
        .iter()
        .find(|j| j.id() == head)
        .ok_or_else(|| anyhow::anyhow!("the group's head was not claimed"))?;
    let why = b.why(&q, head).await?;
    ensure!(
        matches!(&why, Why::Running { worker, .. } if worker == &held.lease.worker),
        "a running job names its worker: {why:?}"
    );
    let why = b.why(&q, behind).await?;
    ensure!(
        why == Why::Held(vec![Hold::Group {
            group: "g".into(),
            holder: Some(head)
        }]),
        "a job behind its group names the running holder: {why:?}"
    );
    // The low-stage job fails with an hour's backoff.
    let low_lease = got
        .iter()
        .find(|j| j.id() == low)
        .ok_or_else(|| anyhow::anyhow!("the stage-1 job was not claimed"))?
        .lease
        .clone();
    b.fail(&low_lease, "boom", Retry::After(Duration::from_secs(3600)))
        .await?;
    let why = b.why(&q, low).await?;
    ensure!(
        matches!(&why, Why::Held(h) if matches!(h.as_slice(), [Hold::Backoff { attempts: 1, .. }])),
        "a retrying job names its backoff: {why:?}"
    );
    b.complete(&held.lease).await?;
    ensure!(
        b.why(&q, head).await? == Why::Finished(JobState::Succeeded),
        "a finished job says so"
    );
    b.set_max_running(&q, Some(1)).await?;
    // Whatever is running now fills the one slot; pausing adds a second rule.
    let running = b.queue_stats(&q).await?.count(JobState::Running);
    b.pause(&q).await?;
    let why = b.why(&q, behind).await?;
    let Why::Held(holds) = &why else {
        anyhow::bail!("a paused queue holds its jobs: {why:?}");
    };
    ensure!(holds.contains(&Hold::Paused), "the pause is named: {why:?}");
    let at_max = holds.iter().find_map(|h| match h {
        Hold::MaxRunning {
            max: 1,
            running: r,
            holders,
        } => Some((*r, holders.clone())),
        _ => None,
    });
    ensure!(
        (running >= 1) == at_max.is_some(),
        "max_running is named exactly when it is reached ({running} running): {why:?}"
    );
    if let Some((r, holders)) = at_max {
        let listed: Vec<JobId> = holders.iter().map(|(id, _)| *id).collect();
        let now_running: Vec<JobId> = b.running(&q).await?.iter().map(|j| j.id).collect();
        ensure!(
            r == running && !listed.is_empty() && listed.iter().all(|id| now_running.contains(id)),
            "the slots' holders are named: {listed:?}, running {now_running:?}"
        );
    }
    expect_not_found(
        b.why(&q, JobId(i64::MAX - 1)).await,
        "why of an unknown job",
    )?;
    Ok(())
}

/// SPEC M6, G2: a group held by a retrying job (which keeps its place) names that job,
/// through `group_holder` and in `why`; a group with no running or retrying job names
/// none; bad input is `InvalidInput`.
pub async fn m6_why_names_a_retrying_group_holder(env: &Env) -> anyhow::Result<()> {
    use relayq_core::{Hold, InspectExt, Why};
    let b = env.backend();
    let q = queue_name("m6retry");
    let head = enqueue(
        b,
        NewJob::new(&q, b"head".to_vec()).group("g").max_attempts(3),
    )
    .await?;
    let behind = enqueue(b, NewJob::new(&q, b"behind".to_vec()).group("g")).await?;
    let got = claim_exactly(b, &q, &[head]).await?;
    enqueue(b, NewJob::new(&q, b"alone".to_vec()).group("waiting")).await?;
    b.fail(
        &got[0].lease,
        "later",
        Retry::After(Duration::from_secs(3600)),
    )
    .await?;
    ensure!(
        b.group_holder(&q, "g").await? == Some(head),
        "the retrying head holds its group"
    );
    ensure!(
        b.group_holder(&q, "waiting").await?.is_none(),
        "a group whose job only waits has no holder"
    );
    ensure!(
        b.group_holder(&q, "none").await?.is_none(),
        "an unknown group has no holder"
    );
    let why = b.why(&q, behind).await?;
    ensure!(
        why == Why::Held(vec![Hold::Group {
            group: "g".into(),
            holder: Some(head)
        }]),
        "a job behind a retrying holder names it: {why:?}"
    );
    expect_invalid(
        b.group_holder("bad queue", "g").await,
        "queue",
        "a bad queue",
    )?;
    expect_invalid(
        b.group_holder(&q, &"g".repeat(256)).await,
        "group",
        "a group of 256 bytes",
    )
}

/// SPEC M1: a batch's progress says when it was opened and when its last job to finish
/// finished, so its duration can be read; none before a job finished.
pub async fn m1_a_batch_says_when_it_opened_and_last_finished(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("m1times");
    let batch = b.open_batch(&q, OnFailure::Continue).await?;
    let p = b.batch_progress(&batch).await?;
    let opened = p
        .created_at
        .ok_or_else(|| anyhow::anyhow!("no creation time: {p:?}"))?;
    let off = (chrono::Utc::now() - opened).num_seconds().abs();
    ensure!(off < 60, "opened at {opened}, {off} s from now");
    ensure!(p.last_finished_at.is_none(), "nothing finished yet: {p:?}");
    let ids = super::support::enqueue_all(
        b,
        vec![
            NewJob::new(&q, b"a".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"b".to_vec()).in_batch(batch.id, 1),
        ],
    )
    .await?;
    b.seal(&batch).await?;
    let got = claim_exactly(b, &q, &ids).await?;
    b.complete(&got[0].lease).await?;
    let first = b.batch_progress(&batch).await?.last_finished_at;
    let finished = b.job(&q, ids[0]).await?.finished_at;
    ensure!(
        first.is_some() && first == finished,
        "the last finish should be job {}'s, {finished:?}: {first:?}",
        ids[0]
    );
    b.cancel_job(&q, ids[1]).await?;
    let p = b.batch_progress(&batch).await?;
    let last = b.job(&q, ids[1]).await?.finished_at;
    ensure!(
        p.last_finished_at == last && last >= first,
        "after the cancel the last finish is {last:?}: {p:?}"
    );
    ensure!(
        p.created_at == Some(opened),
        "the creation time moved: {p:?}"
    );
    Ok(())
}
