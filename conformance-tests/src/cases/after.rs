//! SPEC D — dependencies: a job of a batch runs after the jobs it names, promoted in the
//! settle that finishes the last of them, and cancelled with them by default.

use std::time::Duration;

use anyhow::ensure;
use relayq_core::{
    AfterFailure, Backend, Batch, CompleteExt, Hold, InspectExt, JobId, JobState, NewBatch, NewJob,
    OnFailure, Retry, Why,
};

use super::support::{
    PATIENCE, SHORT_LEASE, claim, claim_as, claim_exactly, claim_nothing, enqueue, enqueue_all,
    expect_invalid, expect_state, ids, total,
};
use crate::{Env, poll_until, queue_name};

fn job(q: &str, batch: &Batch, name: &str) -> NewJob {
    NewJob::new(q, name.as_bytes().to_vec()).in_batch(batch.id, 0)
}

async fn open(b: &dyn Backend, q: &str) -> anyhow::Result<Batch> {
    Ok(b.open_batch(q, OnFailure::Continue).await?)
}

/// Completes the running `id` of `q`, claimed into `held`.
async fn complete(
    b: &dyn Backend,
    held: &mut Vec<relayq_core::ClaimedJob>,
    id: JobId,
) -> anyhow::Result<()> {
    let at = held
        .iter()
        .position(|j| j.id() == id)
        .ok_or_else(|| anyhow::anyhow!("job {id} is not held"))?;
    let job = held.remove(at);
    b.complete(&job.lease).await?;
    Ok(())
}

/// SPEC D1, D2: a diamond. The top runs alone; both middle jobs become claimable in
/// the settle that finishes it; the join waits for both and starts exactly once.
pub async fn d1_a_diamond_runs_in_order(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d1dia");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "join").after_call(1).after_call(2),
            job(&q, &batch, "left").after_call(3),
            job(&q, &batch, "right").after_call(3),
            job(&q, &batch, "top"),
        ],
    )
    .await?;
    let (join, left, right, top) = (made[0], made[1], made[2], made[3]);
    expect_state(b, &q, join, JobState::Blocked).await?;
    expect_state(b, &q, left, JobState::Blocked).await?;
    let mut held = claim_exactly(b, &q, &[top]).await?;
    complete(b, &mut held, top).await?;
    let mut got = claim(b, &q, 10).await?;
    let mut seen = ids_sorted(&got);
    ensure!(
        seen == sorted(&[left, right]),
        "after the top, both middle jobs and only they start: {seen:?}"
    );
    held.append(&mut got);
    complete(b, &mut held, left).await?;
    claim_nothing(b, &q, "the join waits for its second dependency").await?;
    expect_state(b, &q, join, JobState::Blocked).await?;
    complete(b, &mut held, right).await?;
    held = claim_exactly(b, &q, &[join]).await?;
    complete(b, &mut held, join).await?;
    claim_nothing(b, &q, "the join ran once").await?;
    let info = b.job(&q, join).await?;
    seen = info.after.clone();
    ensure!(
        seen == sorted(&[left, right]),
        "the join's `after` lists both middle jobs in id order: {seen:?}"
    );
    Ok(())
}

fn sorted(ids: &[JobId]) -> Vec<JobId> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v
}

fn ids_sorted(jobs: &[relayq_core::ClaimedJob]) -> Vec<JobId> {
    sorted(&ids(jobs))
}

/// SPEC D1: fan-out and fan-in through stored ids: many jobs after one, one after
/// many, named by id in later calls; and a job after one that already succeeded is
/// stored ready.
pub async fn d1_stored_ids_fan_out_and_fan_in(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d1fan");
    let batch = open(b, &q).await?;
    let root = enqueue(b, job(&q, &batch, "root")).await?;
    let fan: Vec<NewJob> = (0..20)
        .map(|i| job(&q, &batch, &format!("f{i}")).after(root))
        .collect();
    let fan = enqueue_all(b, fan).await?;
    let mut sink = job(&q, &batch, "sink");
    for id in &fan {
        sink = sink.after(*id);
    }
    let sink = enqueue(b, sink).await?;
    let mut held = claim_exactly(b, &q, &[root]).await?;
    complete(b, &mut held, root).await?;
    let got = claim(b, &q, 50).await?;
    ensure!(
        ids_sorted(&got) == fan,
        "every job after the root starts once it succeeded: {:?}",
        ids(&got)
    );
    for j in got {
        expect_state(b, &q, sink, JobState::Blocked).await?;
        b.complete(&j.lease).await?;
    }
    held = claim_exactly(b, &q, &[sink]).await?;
    complete(b, &mut held, sink).await?;
    let late = enqueue(b, job(&q, &batch, "late").after(root).after(sink)).await?;
    expect_state(b, &q, late, JobState::Ready).await?;
    Ok(())
}

/// SPEC D2: a failed attempt that retries releases nothing; the retry's success does.
/// A stale settle of a dependency counts for nothing.
pub async fn d2_only_a_fenced_success_releases(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d2fen");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "dep"),
            job(&q, &batch, "child").after_call(0),
        ],
    )
    .await?;
    let (dep, child) = (made[0], made[1]);
    let first = claim_exactly(b, &q, &[dep]).await?.remove(0);
    b.fail(&first.lease, "try again", Retry::After(Duration::ZERO))
        .await?;
    expect_state(b, &q, child, JobState::Blocked).await?;
    // The retry is taken under a short lease that runs out; its holder's late
    // completion is stale and releases nothing.
    let second = poll_until("the retry is claimable", PATIENCE, || async {
        let got = claim_as(b, &q, "w", 5, SHORT_LEASE).await?;
        ensure!(
            got.len() <= 1 && got.iter().all(|j| j.id() == dep),
            "only the retry starts"
        );
        Ok(got.into_iter().next())
    })
    .await?;
    let third = poll_until("the expired retry is taken over", PATIENCE, || async {
        let got = claim(b, &q, 5).await?;
        ensure!(
            got.len() <= 1 && got.iter().all(|j| j.id() == dep),
            "only the retry starts"
        );
        Ok(got.into_iter().next())
    })
    .await?;
    ensure!(
        b.complete(&second.lease).await.is_err(),
        "the expired lease's completion is stale"
    );
    expect_state(b, &q, child, JobState::Blocked).await?;
    b.complete(&third.lease).await?;
    claim_exactly(b, &q, &[child]).await?;
    Ok(())
}

/// SPEC D2: the last two dependencies of many joins, settled at once from two handles:
/// every join starts exactly once, none is left blocked.
pub async fn d2_last_dependencies_settled_at_once(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let other = env.connect().await?;
    let q = queue_name("d2two");
    let batch = open(b, &q).await?;
    let mut jobs = Vec::new();
    for i in 0..20 {
        jobs.push(job(&q, &batch, &format!("a{i}")));
        jobs.push(job(&q, &batch, &format!("b{i}")));
        jobs.push(
            job(&q, &batch, &format!("join{i}"))
                .after_call(3 * i)
                .after_call(3 * i + 1),
        );
    }
    let made = enqueue_all(b, jobs).await?;
    let joins: Vec<JobId> = made.iter().skip(2).step_by(3).copied().collect();
    let got = claim(b, &q, 100).await?;
    ensure!(
        got.len() == 40,
        "the 40 dependencies start, not {}",
        got.len()
    );
    let (mut firsts, mut seconds) = (Vec::new(), Vec::new());
    for j in got {
        let i = made.iter().position(|id| *id == j.id()).unwrap_or(0);
        if i % 3 == 0 {
            firsts.push(j.lease);
        } else {
            seconds.push(j.lease);
        }
    }
    let (x, y) = tokio::join!(
        async {
            for l in firsts {
                b.complete(&l).await?;
            }
            anyhow::Ok(())
        },
        async {
            for l in seconds {
                other.complete(&l).await?;
            }
            anyhow::Ok(())
        }
    );
    x?;
    y?;
    let got = claim(b, &q, 100).await?;
    ensure!(
        ids_sorted(&got) == joins,
        "every join starts once both its dependencies succeeded: {:?}",
        ids(&got)
    );
    claim_nothing(b, &q, "each join started once").await
}

/// SPEC D3: dependencies add to stages and groups. A job of stage 1 after a job of
/// stage 0 waits for the whole of stage 0 too; in a group, a job waiting for its
/// dependencies lets the group's next job go first.
pub async fn d3_dependencies_stages_and_groups_combine(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d3mix");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "a"),
            job(&q, &batch, "slow"),
            NewJob::new(&q, b"b".to_vec())
                .in_batch(batch.id, 1)
                .after_call(0),
            NewJob::new(&q, b"g1".to_vec())
                .in_batch(batch.id, 1)
                .group("g")
                .after_call(2),
            NewJob::new(&q, b"g2".to_vec())
                .in_batch(batch.id, 1)
                .group("g"),
        ],
    )
    .await?;
    let (a, slow, later, g1, g2) = (made[0], made[1], made[2], made[3], made[4]);
    let mut held = claim(b, &q, 10).await?;
    ensure!(
        ids_sorted(&held) == sorted(&[a, slow]),
        "stage 0 starts alone: {:?}",
        ids(&held)
    );
    complete(b, &mut held, a).await?;
    claim_nothing(b, &q, "stage 1 waits for the rest of stage 0").await?;
    expect_state(b, &q, later, JobState::Blocked).await?;
    complete(b, &mut held, slow).await?;
    held = claim(b, &q, 10).await?;
    ensure!(
        ids_sorted(&held) == sorted(&[later, g2]),
        "stage 1 opens: the job after `a`, and the group's job without dependencies \
         ahead of the one still waiting: {:?}",
        ids(&held)
    );
    expect_state(b, &q, g1, JobState::Blocked).await?;
    complete(b, &mut held, later).await?;
    claim_nothing(b, &q, "g1's dependency is done, but g2 holds the group").await?;
    complete(b, &mut held, g2).await?;
    claim_exactly(b, &q, &[g1]).await?;
    Ok(())
}

/// SPEC D4: by default a dead dependency cancels its dependents and theirs, naming
/// the job that failed; a job that runs anyway starts.
pub async fn d4_a_dead_dependency_cancels_down_the_graph(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d4dead");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "dep").max_attempts(1),
            job(&q, &batch, "child").after_call(0),
            job(&q, &batch, "grandchild").after_call(1),
            job(&q, &batch, "anyway")
                .after_call(0)
                .after_failure(AfterFailure::Run),
            job(&q, &batch, "after anyway").after_call(3),
        ],
    )
    .await?;
    let (dep, child, grand, anyway, next) = (made[0], made[1], made[2], made[3], made[4]);
    let held = claim_exactly(b, &q, &[dep]).await?;
    b.fail(&held[0].lease, "boom", Retry::Never).await?;
    expect_state(b, &q, child, JobState::Cancelled).await?;
    expect_state(b, &q, grand, JobState::Cancelled).await?;
    let err = b.job(&q, child).await?.last_error.unwrap_or_default();
    ensure!(
        err.contains(&format!("job {dep}")) && err.contains("dead"),
        "the cancelled job's error names the dead job: {err:?}"
    );
    let err = b.job(&q, grand).await?.last_error.unwrap_or_default();
    ensure!(
        err.contains(&format!("job {child}")) && err.contains("cancelled"),
        "the next one's names the cancelled job it ran after: {err:?}"
    );
    let held = claim_exactly(b, &q, &[anyway]).await?;
    b.complete(&held[0].lease).await?;
    claim_exactly(b, &q, &[next]).await?;
    Ok(())
}

/// SPEC D4: a batch whose policy is `Run` runs dependents of a failed job; a job of it
/// that says `Cancel` is cancelled. A cancelled dependency counts as a failed one.
pub async fn d4_the_batch_policy_and_the_job_override(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d4pol");
    let batch = b
        .open_batch_with(&NewBatch::new(&q).after_failure(AfterFailure::Run))
        .await?;
    let progress = b.batch_progress(&batch).await?;
    ensure!(
        progress.after_failure == AfterFailure::Run,
        "the batch's progress carries its policy: {:?}",
        progress.after_failure
    );
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "dep"),
            job(&q, &batch, "runs").after_call(0),
            job(&q, &batch, "stops")
                .after_call(0)
                .after_failure(AfterFailure::Cancel),
        ],
    )
    .await?;
    ensure!(
        b.cancel_job(&q, made[0]).await?,
        "the dependency is cancelled"
    );
    expect_state(b, &q, made[2], JobState::Cancelled).await?;
    claim_exactly(b, &q, &[made[1]]).await?;
    Ok(())
}

/// SPEC D4: every way a dependency fails reaches its dependents: a lease that runs out
/// on the last attempt, and a cancel; and a job named after one already failed is
/// stored cancelled (or ready, when it runs anyway).
pub async fn d4_every_way_to_fail_reaches_dependents(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d4way");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "expires").max_attempts(1),
            job(&q, &batch, "after it").after_call(0),
        ],
    )
    .await?;
    claim_as(b, &q, "w", 1, SHORT_LEASE).await?;
    poll_until("the expired job dies", PATIENCE, || async {
        b.maintain(&q, relayq_core::DEFAULT_RETENTION).await?;
        let dead = b.job(&q, made[0]).await?.state == JobState::Dead;
        Ok(dead.then_some(()))
    })
    .await?;
    expect_state(b, &q, made[1], JobState::Cancelled).await?;
    let cancelled = enqueue(b, job(&q, &batch, "x")).await?;
    ensure!(b.cancel_job(&q, cancelled).await?, "cancelled");
    let late = enqueue_all(
        b,
        vec![
            job(&q, &batch, "after dead").after(made[0]),
            job(&q, &batch, "after cancelled").after(cancelled),
            job(&q, &batch, "anyway")
                .after(made[0])
                .after_failure(AfterFailure::Run),
            job(&q, &batch, "after the cancelled one").after_call(0),
        ],
    )
    .await?;
    expect_state(b, &q, late[0], JobState::Cancelled).await?;
    expect_state(b, &q, late[1], JobState::Cancelled).await?;
    expect_state(b, &q, late[2], JobState::Ready).await?;
    expect_state(b, &q, late[3], JobState::Cancelled).await?;
    Ok(())
}

/// SPEC D5: bad dependencies are `InvalidInput` on `after`, with nothing stored: a
/// cycle (named in order), an unknown id, a job of another batch, a job of a higher
/// stage (stored or in the call), a job without a batch.
pub async fn d5_bad_dependencies_store_nothing(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d5bad");
    let batch = open(b, &q).await?;
    let other = open(b, &q).await?;
    // An unfinished job of stage 0 keeps the stages above it closed to nothing.
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "anchor"),
            NewJob::new(&q, vec![]).in_batch(batch.id, 2),
        ],
    )
    .await?;
    let high = made[1];
    let elsewhere = enqueue(b, job(&q, &other, "other")).await?;
    let before = total(b, &q).await?;
    let cycle = b
        .enqueue(vec![
            job(&q, &batch, "a").after_call(2),
            job(&q, &batch, "b").after_call(0),
            job(&q, &batch, "c").after_call(1),
        ])
        .await;
    let text = cycle
        .as_ref()
        .map_or_else(ToString::to_string, |_| String::new());
    expect_invalid(cycle, "after", "a cycle")?;
    ensure!(
        text.contains("cycle")
            && ["jobs[0]", "jobs[1]", "jobs[2]"]
                .iter()
                .all(|j| text.contains(j)),
        "the error names the cycle's jobs: {text}"
    );
    let cases = [
        (
            job(&q, &batch, "x").after(JobId(high.0 + 1_000_000)),
            "an unknown id",
        ),
        (
            job(&q, &batch, "x").after(elsewhere),
            "a job of another batch",
        ),
        (
            NewJob::new(&q, vec![])
                .in_batch(batch.id, 2)
                .after(high)
                .after(elsewhere),
            "a job of another batch, after a good one",
        ),
        (job(&q, &batch, "x").after(high), "a job of a higher stage"),
        (NewJob::new(&q, vec![]).after(high), "a job without a batch"),
    ];
    for (bad, what) in cases {
        expect_invalid(
            b.enqueue(vec![job(&q, &batch, "fine"), bad]).await,
            "after",
            what,
        )?;
    }
    expect_invalid(
        b.enqueue(vec![
            NewJob::new(&q, vec![]).in_batch(batch.id, 3),
            NewJob::new(&q, vec![]).in_batch(batch.id, 2).after_call(0),
        ])
        .await,
        "after",
        "a job of the call at a higher stage",
    )?;
    ensure!(
        total(b, &q).await? == before,
        "a refused enqueue stored jobs"
    );
    Ok(())
}

/// SPEC D6, M6: "why not running" names the unfinished jobs a job runs after.
pub async fn d6_why_names_unfinished_dependencies(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d6why");
    let batch = open(b, &q).await?;
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "a"),
            job(&q, &batch, "b"),
            job(&q, &batch, "c").after_call(0).after_call(1),
        ],
    )
    .await?;
    let held = claim(b, &q, 1).await?;
    b.complete(&held[0].lease).await?;
    let left: Vec<JobId> = made[..2]
        .iter()
        .copied()
        .filter(|i| *i != held[0].id())
        .collect();
    match b.why(&q, made[2]).await? {
        Why::Held(holds) => ensure!(
            holds.contains(&Hold::After {
                jobs: left.clone(),
                more: false
            }),
            "why names {left:?}: {holds:?}"
        ),
        other => anyhow::bail!("the job is held, not {other:?}"),
    }
    Ok(())
}

/// SPEC D5: a backend that does not keep dependencies refuses them, and a batch policy
/// other than the default, on the field, storing nothing; one that does accepts both.
pub async fn d5_dependencies_are_kept_or_refused(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d5kept");
    let batch = open(b, &q).await?;
    let jobs = vec![job(&q, &batch, "a"), job(&q, &batch, "b").after_call(0)];
    let policy = NewBatch::new(&q).after_failure(AfterFailure::Run);
    if b.limits().dependencies {
        enqueue_all(b, jobs).await?;
        b.open_batch_with(&policy).await?;
        return Ok(());
    }
    expect_invalid(b.enqueue(jobs).await, "after", "dependencies")?;
    ensure!(total(b, &q).await? == 0, "a refused enqueue stored jobs");
    expect_invalid(
        b.open_batch_with(&policy).await,
        "after_failure",
        "a dependency policy",
    )
}

/// SPEC D6: `wait_job` returns a job once it finished, here a child once the settle of
/// its parent released it and its own completed; and times out on an unfinished one.
pub async fn d6_wait_for_one_job(env: &Env) -> anyhow::Result<()> {
    let b = env.shared();
    let q = queue_name("d6wait");
    let batch = open(&*b, &q).await?;
    let made = enqueue_all(
        &*b,
        vec![
            job(&q, &batch, "parent"),
            job(&q, &batch, "child").after_call(0),
        ],
    )
    .await?;
    let early = b.wait_job(&q, made[1], Duration::from_millis(50)).await;
    ensure!(
        matches!(early, Err(relayq_core::Error::Timeout { .. })),
        "a blocked job's wait times out: {early:?}"
    );
    let waiter = {
        let (b, q, id) = (b.clone(), q.clone(), made[1]);
        tokio::spawn(async move { b.wait_job(&q, id, PATIENCE).await })
    };
    let mut held = claim_exactly(&*b, &q, &[made[0]]).await?;
    complete(&*b, &mut held, made[0]).await?;
    held = claim_exactly(&*b, &q, &[made[1]]).await?;
    complete(&*b, &mut held, made[1]).await?;
    let done = waiter.await??;
    ensure!(
        done.state == JobState::Succeeded,
        "the wait returns the finished job: {:?}",
        done.state
    );
    Ok(())
}

/// SPEC D2: a job cancelled at enqueue (its parent had failed) that empties its stage
/// releases the next one, and a job of that stage waiting for another of the same call
/// still waits for it.
pub async fn d2_a_cancel_at_enqueue_starts_no_child_early(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d2early");
    let batch = open(b, &q).await?;
    let failed = enqueue(b, job(&q, &batch, "x")).await?;
    ensure!(b.cancel_job(&q, failed).await?, "cancelled");
    let made = enqueue_all(
        b,
        vec![
            job(&q, &batch, "after x").after(failed),
            NewJob::new(&q, b"waits".to_vec())
                .in_batch(batch.id, 1)
                .after_call(2),
            NewJob::new(&q, b"first".to_vec()).in_batch(batch.id, 1),
        ],
    )
    .await?;
    expect_state(b, &q, made[0], JobState::Cancelled).await?;
    expect_state(b, &q, made[1], JobState::Blocked).await?;
    let mut held = claim_exactly(b, &q, &[made[2]]).await?;
    complete(b, &mut held, made[2]).await?;
    claim_exactly(b, &q, &[made[1]]).await?;
    Ok(())
}

/// SPEC B7, D4: a batch's cancel counts every unfinished job it ends, those a cancelled
/// job it runs after reached first included, whatever their ids' order.
pub async fn d4_a_batch_cancel_counts_every_job(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("d4count");
    let batch = open(b, &q).await?;
    // A child whose id is below its parent's, then a chain: a cancel that reaches a
    // parent before its child cancels the child too, and the child still counts.
    let mut jobs = vec![job(&q, &batch, "child of the next").after_call(1)];
    jobs.push(job(&q, &batch, "parent"));
    for i in 2..12 {
        jobs.push(job(&q, &batch, &format!("chain {i}")).after_call(i - 1));
    }
    enqueue_all(b, jobs).await?;
    let n = b.cancel_batch(&batch).await?;
    ensure!(n == 12, "the cancel counts all 12 jobs, not {n}");
    let progress = b.batch_progress(&batch).await?;
    let cancelled: u64 = progress.stages.iter().map(|s| s.cancelled).sum();
    ensure!(cancelled == 12, "all 12 cancelled: {progress:?}");
    Ok(())
}
