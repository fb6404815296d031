//! SPEC L7, L8 — a running job's progress, and the result it leaves.

use std::sync::Arc;

use anyhow::{Context, ensure};
use relayq_core::{
    ClaimedJob, CompleteExt, JobState, Lease, LeaseToken, NewJob, Progress, ProgressReport, Retry,
    Settle,
    progress::{MAX_PROGRESS_MESSAGE, MAX_RESULT_BYTES},
    worker::{JobContext, JobError, Worker},
};
use tokio::sync::{Notify, mpsc};

use super::support::{
    LEASE, PATIENCE, claim_exactly, enqueue, enqueue_n, expect_invalid, expect_state,
};
use crate::{Env, poll_until, queue_name};

fn report(lease: &Lease, percent: u8, message: &str) -> ProgressReport {
    ProgressReport {
        lease: lease.clone(),
        percent,
        message: message.into(),
    }
}

/// SPEC L7: progress is stored while the lease holds, tagged with the attempt, shown by
/// `job` and `running`, replaced by the next report and kept once the job finishes. A
/// report under a lease that no longer holds (finished, cancelled, another token) is
/// returned and stores nothing.
pub async fn l7_progress_is_stored_under_the_lease(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l7store");
    let ids = enqueue_n(b, &q, 3).await?;
    let got = claim_exactly(b, &q, &ids).await?;
    let (done, cancelled, quiet) = (&got[0].lease, &got[1].lease, &got[2].lease);
    let lost = b
        .report_progress(&[report(done, 10, "starting"), report(cancelled, 5, "")])
        .await?;
    ensure!(lost.is_empty(), "held leases reported lost: {lost:?}");
    let lost = b
        .report_progress(&[report(done, 40, "copying table \"x\"; -- {ok}")])
        .await?;
    ensure!(lost.is_empty(), "a held lease reported lost: {lost:?}");
    let want = Progress {
        attempt: 1,
        percent: 40,
        message: "copying table \"x\"; -- {ok}".into(),
    };
    let info = b.job(&q, done.job).await?;
    ensure!(
        info.progress.as_ref() == Some(&want),
        "job shows {:?}, expected {want:?}",
        info.progress
    );
    let running = b.running(&q).await?;
    let shown = |id| {
        running
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.progress.clone())
    };
    ensure!(
        shown(done.job) == Some(Some(want.clone())),
        "running shows {:?} for the reporting job",
        shown(done.job)
    );
    ensure!(
        shown(quiet.job) == Some(None),
        "running shows {:?} for a job that never reported",
        shown(quiet.job)
    );

    b.complete(done).await?;
    b.cancel_job(&q, cancelled.job).await?;
    let forged = Lease {
        token: LeaseToken(uuid::Uuid::new_v4()),
        ..quiet.clone()
    };
    let mut lost = b
        .report_progress(&[
            report(done, 99, "late"),
            report(cancelled, 99, "late"),
            report(&forged, 99, "zombie"),
        ])
        .await?;
    lost.sort_unstable();
    let mut want_lost = vec![done.job, cancelled.job, quiet.job];
    want_lost.sort_unstable();
    ensure!(lost == want_lost, "lost {lost:?}, expected {want_lost:?}");
    let kept = b.job(&q, done.job).await?.progress;
    ensure!(
        kept.as_ref() == Some(&want),
        "a finished job shows {kept:?}, expected its last report {want:?}"
    );
    let cancelled_shows = b.job(&q, cancelled.job).await?.progress;
    ensure!(
        cancelled_shows.as_ref().map(|p| p.percent) == Some(5),
        "a late report changed a cancelled job: {cancelled_shows:?}"
    );
    let quiet_shows = b.job(&q, quiet.job).await?.progress;
    ensure!(
        quiet_shows.is_none(),
        "a forged token stored progress: {quiet_shows:?}"
    );
    Ok(())
}

/// SPEC L7, X2: a percent over 100, a message over 255 bytes, more than 1000 reports, a
/// job twice or a bad queue name is `InvalidInput` naming the field, and nothing of
/// the call is stored; a message of exactly 255 bytes is fine.
pub async fn l7_bad_progress_stores_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l7bad");
    let ids = enqueue_n(b, &q, 2).await?;
    let got = claim_exactly(b, &q, &ids).await?;
    let (one, two) = (&got[0].lease, &got[1].lease);
    let good = report(one, 50, "fine");
    let long = "é".repeat(MAX_PROGRESS_MESSAGE / 2 + 1);
    let elsewhere = Lease {
        queue: "bad queue".into(),
        ..two.clone()
    };
    let cases = [
        ("percent", vec![good.clone(), report(two, 101, "")], "101 %"),
        ("message", vec![good.clone(), report(two, 1, &long)], "long"),
        ("reports", vec![good.clone(); 1001], "1001 reports"),
        ("reports", vec![good.clone(), report(one, 60, "")], "twice"),
        (
            "queue",
            vec![good.clone(), report(&elsewhere, 1, "")],
            "queue",
        ),
    ];
    for (field, reports, what) in cases {
        expect_invalid(b.report_progress(&reports).await, field, what)?;
    }
    for id in &ids {
        let shows = b.job(&q, *id).await?.progress;
        ensure!(shows.is_none(), "a refused call stored {shows:?}");
    }
    let full = "x".repeat(MAX_PROGRESS_MESSAGE);
    ensure!(
        b.report_progress(&[report(two, 100, &full)])
            .await?
            .is_empty(),
        "a report at the bounds was refused or lost"
    );
    let shows = b.job(&q, two.job).await?.progress;
    ensure!(
        shows.as_ref().map(|p| p.message.len()) == Some(MAX_PROGRESS_MESSAGE),
        "a full message came back as {shows:?}"
    );
    Ok(())
}

/// SPEC L8: a success's output is its result, kept whole up to 64 KiB and read back by
/// `JobInfo::result`; one byte more is `InvalidInput` on `output` for the whole call,
/// which settles nothing. A failure's output over the bound is cut, not refused.
pub async fn l8_result_is_kept_whole_or_refused(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l8result");
    let ids = enqueue_n(b, &q, 3).await?;
    let got = claim_exactly(b, &q, &ids).await?;
    let (full, over, failed) = (&got[0].lease, &got[1].lease, &got[2].lease);
    let result: String =
        "résultat\n".repeat(MAX_RESULT_BYTES / 10) + &"x".repeat(MAX_RESULT_BYTES % 10);
    ensure!(result.len() == MAX_RESULT_BYTES, "the test's result size");
    let too_big = "y".repeat(MAX_RESULT_BYTES + 1);
    expect_invalid(
        b.settle_many(vec![
            Settle::complete(full.clone()).with_output(Some(result.clone())),
            Settle::complete(over.clone()).with_output(Some(too_big.clone())),
        ])
        .await,
        "output",
        "a result one byte over",
    )?;
    for id in [full.job, over.job] {
        expect_state(b, &q, id, JobState::Running).await?;
    }
    b.settle_one(Settle::complete(full.clone()).with_output(Some(result.clone())))
        .await?;
    let info = b.job(&q, full.job).await?;
    ensure!(
        info.result() == Some(result.as_str()),
        "the result came back as {} bytes",
        info.result().map_or(0, str::len)
    );
    b.settle_one(Settle::fail(failed.clone(), "exit 1", Retry::Never).with_output(Some(too_big)))
        .await?;
    let info = b.job(&q, failed.job).await?;
    ensure!(info.result().is_none(), "a dead job has a result");
    let kept = info.attempt_log.last().and_then(|a| a.output.as_deref());
    ensure!(
        kept.map(str::len) == Some(MAX_RESULT_BYTES),
        "a failure's long output was kept as {:?} bytes",
        kept.map(str::len)
    );
    Ok(())
}

/// SPEC L7, L8: a handler's progress reaches `running` while it runs, written by the
/// worker (at most once a second); its returned text is the job's result. A result
/// over the worker's `max_result` fails the job for good, the error naming `result`.
pub async fn l7_worker_writes_progress_and_keeps_the_result(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("l7worker");
    let ok = enqueue(b, NewJob::new(&q, b"ok".to_vec())).await?;
    let big = enqueue(b, NewJob::new(&q, b"big".to_vec()).max_attempts(3)).await?;
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let go = Arc::new(Notify::new());
    let worker = {
        let go = go.clone();
        Worker::builder(env.connect().await?, [q.clone()])
            .concurrency(2)
            .lease(LEASE)
            .no_maintenance()
            .max_result(16)
            .handler(move |job: ClaimedJob| {
                let (go, started_tx) = (go.clone(), started_tx.clone());
                async move {
                    if job.payload == b"big" {
                        return Ok::<_, JobError>("more than sixteen bytes".to_owned());
                    }
                    let ctx = JobContext::current().expect("in a handler");
                    ctx.progress(101, "too far")
                        .expect_err("a percent over 100 is refused at once");
                    ctx.progress(1, "x".repeat(MAX_PROGRESS_MESSAGE + 1))
                        .expect_err("a message over 255 bytes is refused at once");
                    for p in 0..=30 {
                        ctx.progress(p, format!("step {p}"))?;
                    }
                    let _ = started_tx.send(());
                    go.notified().await;
                    Ok("all done".to_owned())
                }
            })
            .build()?
            .spawn()
    };
    started
        .recv()
        .await
        .context("the worker ended before the job started")?;
    // An earlier report may be written first; the last one must follow.
    let shown = poll_until(
        "the handler's last report in `running`",
        PATIENCE,
        || async {
            let running = b.running(&q).await?;
            Ok(running
                .into_iter()
                .find(|r| r.id == ok)
                .and_then(|r| r.progress)
                .filter(|p| p.percent == 30))
        },
    )
    .await?;
    ensure!(
        shown.message == "step 30" && shown.attempt == 1,
        "the last report should win, got {shown:?}"
    );
    go.notify_one();
    expect_eventually(b, &q, ok, JobState::Succeeded).await?;
    let info = b.job(&q, ok).await?;
    ensure!(
        info.result() == Some("all done"),
        "result {:?}",
        info.result()
    );
    expect_eventually(b, &q, big, JobState::Dead).await?;
    let info = b.job(&q, big).await?;
    let error = info.last_error.unwrap_or_default();
    ensure!(
        error.contains("result") && info.attempts == 1,
        "an over-long result should fail the job at once naming `result`: {error:?}, {} attempts",
        info.attempts
    );
    worker.shutdown().await?;
    Ok(())
}

async fn expect_eventually(
    b: &dyn relayq_core::Backend,
    q: &str,
    id: relayq_core::JobId,
    state: JobState,
) -> anyhow::Result<()> {
    poll_until(&format!("job {id} to be {state}"), PATIENCE, || async {
        Ok((b.job(q, id).await?.state == state).then_some(()))
    })
    .await
}
