//! Every hot statement reads rows in proportion to its own work, whatever the
//! planner's statistics say.
//!
//! A drained queue analyzed by autovacuum has `reltuples` near zero; the next burst is
//! then planned for an empty table. The claim's `UPDATE ... FROM c` walked all of
//! `jobs` once per claim in that state (1,081 ms per claim of 100, against 4.5 ms).
//! Each test here puts the tables in one statistics state with 50,000 rows where the
//! operations can see them, runs every hot operation once with custom plans and once
//! with generic plans (what a prepared statement may switch to after five runs), and
//! counts the rows and index entries the operation's connection read. A plan that
//! scans the queue reads tens of thousands; every operation here touches at most a
//! few hundred jobs.
//!
//! The reads come from the server's own counters (`pg_stat_user_tables.seq_tup_read`
//! and `idx_tup_fetch`: live rows), which a connection reports when it ends:
//! each operation runs on a connection of its own, closed after it. Not a timed test.

use std::time::Duration;

use relayq_conformance::{poll_until, queue_name};
use relayq_core::{
    Admin, Batch, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Inspect, JobFilter, JobState,
    NewJob, OnFailure, OrderBarrier, OrderBarrierExt, ProgressReport, Retry, Settle, WaitFor,
};
use relayq_postgres::{Config, PostgresBackend};

mod common;
use common::{drop_schema, fresh, run_sql};

/// The rows the planner should not walk: the queue (or, emptied, the finished table).
const BIG: usize = 50_000;
/// Reads allowed to one operation: a few hundred jobs touched, each read a few
/// times, with room to spare. A scan of the queue reads at least `BIG`.
const ALLOWED: i64 = 3_000;
const LEASE: Duration = Duration::from_secs(60);

/// The four states of the planner's statistics the issue names.
#[derive(Debug, Clone, Copy)]
enum Stats {
    /// A large table that was never analyzed (before autovacuum's first pass).
    Never,
    /// Analyzed while empty, then filled: a drained queue meets the next burst.
    EmptyThenFilled,
    /// Analyzed while full, then drained: the statistics promise rows that are gone.
    FullThenEmptied,
    /// Analyzed with the rows in two giant groups and one giant batch stage.
    GiantGroups,
}

async fn hot_statements_read_little_never_analyzed(url: String) {
    check(url, Stats::Never).await;
}

async fn hot_statements_read_little_analyzed_empty_then_filled(url: String) {
    check(url, Stats::EmptyThenFilled).await;
}

async fn hot_statements_read_little_analyzed_full_then_emptied(url: String) {
    check(url, Stats::FullThenEmptied).await;
}

async fn hot_statements_read_little_analyzed_with_giant_groups(url: String) {
    check(url, Stats::GiantGroups).await;
}

/// The tables in one state, and the queue the operations work on.
struct Lab {
    /// The server's URL, naming the test's connections (`application_name`).
    url: String,
    tag: String,
    /// For setting the state up; closed and made again around each measurement.
    b: PostgresBackend,
    /// Reads the server's counters; never reads the schema's tables.
    reader: PostgresBackend,
    q: String,
}

/// One state at a time: an index scan marks the entries of rows dead to every
/// transaction as it passes, so later scans skip them. Another test's open snapshot
/// stops that, and the operations would then read the dead entries the drain left,
/// whatever their plans (a cost of vacuum held back, which the bench's phases measure).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn check(url: String, stats: Stats) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let reader = fresh(&url, "stats").await;
    let s = reader.schema().to_owned();
    // Nothing analyzes behind the test's back on a server where autovacuum runs.
    for t in ["jobs", "finished", "attempts", "batches", "queues"] {
        run_sql(
            &reader,
            format!("ALTER TABLE \"{s}\".{t} SET (autovacuum_enabled = false)"),
        )
        .await;
    }
    let tag = s.replace('_', "-");
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}application_name={tag}");
    let mut lab = Lab {
        b: session(&url, &s, false).await,
        url,
        tag,
        reader,
        q: queue_name("stats"),
    };
    match stats {
        Stats::Never => fill(&lab, BIG).await,
        Stats::EmptyThenFilled => {
            // Drained rather than never filled: the table keeps its pages, and the
            // planner takes its rows per page from `reltuples / relpages`, zero.
            fill(&lab, BIG).await;
            drain(&lab).await;
            analyze(&lab).await;
            fill(&lab, BIG).await;
        }
        Stats::FullThenEmptied => {
            fill(&lab, BIG).await;
            analyze(&lab).await;
            drain(&lab).await;
            // Work for the operations below: few rows, planned as if there were many.
            fill(&lab, 2_000).await;
        }
        Stats::GiantGroups => {
            fill_giant(&lab).await;
            analyze(&lab).await;
        }
    }
    let mut failures = Vec::new();
    for generic in [false, true] {
        for (what, read) in operations(&mut lab, generic).await {
            eprintln!("{stats:?}, generic plans {generic}: {what}: {read}");
            if read > ALLOWED {
                failures.push(format!("{what} (generic plans: {generic}) read {read}"));
            }
        }
    }
    lab.b.pool().close().await;
    drop_schema(&lab.reader).await;
    assert!(
        failures.is_empty(),
        "{stats:?}: operations read more than {ALLOWED} rows or index entries:\n{}",
        failures.join("\n")
    );
}

/// `n` ready jobs in the lab's queue, enqueued as users do.
async fn fill(lab: &Lab, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        let jobs = chunk
            .iter()
            .map(|i| NewJob::new(&lab.q, i.to_string().into_bytes()))
            .collect();
        lab.b.enqueue(jobs).await.unwrap();
    }
}

/// Two groups of 20,000 jobs and a batch whose last stage holds 10,000.
async fn fill_giant(lab: &Lab) {
    for group in ["giant-a", "giant-b"] {
        for _ in 0..4 {
            let jobs = (0..5_000)
                .map(|i| NewJob::new(&lab.q, format!("{i}").into_bytes()).group(group))
                .collect();
            lab.b.enqueue(jobs).await.unwrap();
        }
    }
    // `Continue`: a dead job of a `Halt` batch would cancel the whole stage, and the
    // settles below fail some of its jobs. What this batch is for is a big stage.
    let batch = lab.b.open_batch(&lab.q, OnFailure::Continue).await.unwrap();
    for _ in 0..2 {
        let jobs = (0..5_000)
            .map(|i| NewJob::new(&lab.q, format!("{i}").into_bytes()).in_batch(batch.id, 900))
            .collect();
        lab.b.enqueue(jobs).await.unwrap();
    }
    lab.b.seal(&batch).await.unwrap();
}

/// Claims and completes every job of the queue, as workers would.
///
/// Each job leaves a dead entry in the running index. The first scan of that index
/// after the drain marks them dead as it passes (one pass, whatever the plan); the
/// drain makes that scan here, so the operations below are measured on their plans,
/// not on that one-time cost (dead rows are vacuum's cost, not the plan's).
async fn drain(lab: &Lab) {
    drain_queue(lab).await;
    lab.b
        .set_max_running(&lab.q, Some(1_000_000))
        .await
        .unwrap();
    assert!(claim(&lab.b, &lab.q, 1, LEASE).await.is_empty());
    lab.b.set_max_running(&lab.q, None).await.unwrap();
}

async fn drain_queue(lab: &Lab) {
    loop {
        let got = lab
            .b
            .claim(ClaimRequest::new(&lab.q, "drain", 1_000, LEASE))
            .await
            .unwrap();
        if got.is_empty() {
            return;
        }
        let settles = got.into_iter().map(|j| Settle::complete(j.lease)).collect();
        for r in lab.b.settle_many(settles).await.unwrap() {
            r.unwrap();
        }
    }
}

/// Refreshes the planner's statistics of every table, as autovacuum's analyze would.
async fn analyze(lab: &Lab) {
    let s = lab.b.schema();
    for t in ["jobs", "finished", "attempts", "batches", "queues"] {
        run_sql(&lab.b, format!("ANALYZE \"{s}\".{t}")).await;
    }
}

/// Runs every hot operation once on connections planning as `generic` says; returns
/// what each read.
async fn operations(lab: &mut Lab, generic: bool) -> Vec<(&'static str, i64)> {
    let q = &lab.q.clone();
    let mut out = Vec::new();
    let mut read = |what, n| out.push((what, n));

    // Claims, and settles of every kind, of jobs at the head of the big queue.
    let (n, got) = measured(lab, generic, async move |b| claim(b, q, 100, LEASE).await).await;
    read("claim of 100", n);
    let mut leases = got.into_iter().map(|j| j.lease);
    let completes: Vec<Settle> = leases.by_ref().take(50).map(Settle::complete).collect();
    // Five of them, deleted by id below (SPEC M8).
    let done: Vec<relayq_core::JobId> = completes.iter().take(5).map(|s| s.lease.job).collect();
    let (n, ()) = measured(lab, generic, async move |b| settle(b, completes).await).await;
    read("settle of 50 completions", n);
    let mut mixed = Vec::new();
    // The ten retried an hour from now, made due again below (SPEC M10).
    let mut later = Vec::new();
    for (i, lease) in leases.by_ref().take(40).enumerate() {
        if i % 4 == 1 {
            later.push(lease.job);
        }
        mixed.push(match i % 4 {
            0 => Settle::complete(lease),
            1 => Settle::fail(lease, "again", Retry::After(Duration::from_secs(3600))),
            2 => Settle::fail(lease, "dead", Retry::Never),
            _ => Settle::release(lease),
        });
    }
    let (n, ()) = measured(lab, generic, async move |b| settle(b, mixed).await).await;
    read("settle of 40 mixed outcomes", n);
    let lease = leases.next().unwrap();
    let (n, ()) = measured(lab, generic, async move |b| {
        b.heartbeat(&lease, LEASE).await.unwrap();
    })
    .await;
    read("heartbeat", n);
    // The read a worker makes for cancels (SPEC B8), of the leases left.
    let rest: Vec<_> = leases.collect();
    let reports: Vec<ProgressReport> = rest
        .iter()
        .map(|lease| ProgressReport {
            lease: lease.clone(),
            percent: 50,
            message: "half".into(),
        })
        .collect();
    let (n, ()) = measured(lab, generic, async move |b| {
        b.lost_leases(&rest).await.unwrap();
    })
    .await;
    read("lost_leases of 9", n);
    // The progress a worker writes once a second (SPEC L7), of the same leases.
    let (n, ()) = measured(lab, generic, async move |b| {
        assert!(b.report_progress(&reports).await.unwrap().is_empty());
    })
    .await;
    read("report_progress of 9", n);

    // Enqueues with dedupe keys: new keys, then the same keys again.
    let tag = if generic { "g" } else { "c" };
    let keyed = || {
        (0..100)
            .map(|i| NewJob::new(q, vec![]).dedupe_key(format!("{tag}-{i}")))
            .collect::<Vec<_>>()
    };
    let (n, ()) = measured(lab, generic, async move |b| {
        b.enqueue(keyed()).await.unwrap();
    })
    .await;
    read("enqueue of 100 with dedupe keys", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        b.enqueue(keyed()).await.unwrap();
    })
    .await;
    read("enqueue of 100 duplicates", n);

    // Each part below puts its jobs at the head of the queue, ahead of everything
    // left from earlier parts.
    let head = if generic { -10 } else { -5 };
    // Lease expiry: taken over by a claim, and made dead when no attempt is left.
    let early = |attempts| {
        (0..10)
            .map(|_| NewJob::new(q, vec![]).priority(head).max_attempts(attempts))
            .collect::<Vec<_>>()
    };
    lab.b.enqueue(early(3)).await.unwrap();
    lab.b.enqueue(early(1)).await.unwrap();
    let short = claim(&lab.b, q, 20, Duration::from_millis(1)).await;
    assert_eq!(short.len(), 20);
    expired(&lab.b, &short).await;
    let (n, got) = measured(lab, generic, async move |b| claim(b, q, 20, LEASE).await).await;
    read("claim taking over 10 expired leases, 10 made dead", n);
    assert!(got.len() >= 10, "expired jobs are claimed again");

    // A queue with a concurrency limit claims under the queue's lock.
    lab.b.set_max_running(q, Some(100_000)).await.unwrap();
    let (n, got) = measured(lab, generic, async move |b| claim(b, q, 50, LEASE).await).await;
    read("claim of 50 in a limited queue", n);
    assert_eq!(got.len(), 50);
    lab.b.set_max_running(q, None).await.unwrap();

    // A queue whose only limit is a rate claims in one statement under its row's lock
    // (SPEC K9); a rate far above the claims' never cuts one.
    let fast = relayq_core::Rate::new(1_000_000, Duration::from_secs(1));
    let rated = relayq_core::QueueUpdate::default().rate(Some(fast));
    lab.b.update_queue(q, rated).await.unwrap();
    let (n, got) = measured(lab, generic, async move |b| claim(b, q, 50, LEASE).await).await;
    read("claim of 50 in a queue with a rate", n);
    assert_eq!(got.len(), 50);
    let lifted = relayq_core::QueueUpdate::default().rate(None);
    lab.b.update_queue(q, lifted).await.unwrap();

    // Groups: the holder finishes and the next job of its group is promoted.
    let group = format!("small-{tag}");
    let grouped = (0..3)
        .map(|_| NewJob::new(q, vec![]).priority(head - 1).group(&group))
        .collect();
    lab.b.enqueue(grouped).await.unwrap();
    let holder = claim(&lab.b, q, 1, LEASE).await.remove(0).lease;
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::complete(holder)]).await;
    })
    .await;
    read("settle of a group's holder", n);

    // Stages: the last job of a stage finishes and releases the next.
    let batch = lab.b.open_batch(q, OnFailure::Halt).await.unwrap();
    let staged = [100, 100, 200, 200, 300]
        .into_iter()
        .map(|stage| {
            NewJob::new(q, vec![])
                .priority(head - 2)
                .in_batch(batch.id, stage)
        })
        .collect();
    lab.b.enqueue(staged).await.unwrap();
    lab.b.seal(&batch).await.unwrap();
    let mut first = claim(&lab.b, q, 2, LEASE)
        .await
        .into_iter()
        .map(|j| j.lease);
    let (a, z) = (
        first.next().unwrap(),
        first.next().expect("stage 100's two jobs"),
    );
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::complete(a)]).await;
    })
    .await;
    read("settle of a stage's job with a witness left", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::complete(z)]).await;
    })
    .await;
    read("settle releasing the next stage", n);
    let (n, ()) = measured(lab, generic, async move |b| progress(b, &batch).await).await;
    read("batch progress and wait", n);

    // Dependencies (SPEC D): 100 jobs enqueued after two stored ones, then a parent
    // whose settle releases 50 of them and one whose death cancels the other 50.
    let graph = lab.b.open_batch(q, OnFailure::Continue).await.unwrap();
    let node = move |p: i16| NewJob::new(q, vec![]).priority(p).in_batch(graph.id, 0);
    let parents = lab
        .b
        .enqueue(vec![node(head - 4), node(head - 4)])
        .await
        .unwrap();
    let (p0, p1) = (parents[0].id, parents[1].id);
    let (n, ()) = measured(lab, generic, async move |b| {
        let children = (0..100)
            .map(|i| node(head - 3).after(if i % 2 == 0 { p0 } else { p1 }))
            .collect();
        b.enqueue(children).await.unwrap();
    })
    .await;
    read("enqueue of 100 after stored jobs", n);
    let mut two = claim(&lab.b, q, 2, LEASE)
        .await
        .into_iter()
        .map(|j| j.lease);
    let (ok, bad) = (two.next().unwrap(), two.next().expect("both parents"));
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::complete(ok)]).await;
    })
    .await;
    read("settle of a parent releasing 50 children", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::fail(bad, "dead", Retry::Never)]).await;
    })
    .await;
    read("settle of a dead parent cancelling 50 children", n);
    let freed = claim(&lab.b, q, 50, LEASE).await;
    assert_eq!(freed.len(), 50, "the freed children come first");
    settle(
        &lab.b,
        freed
            .into_iter()
            .map(|j| Settle::complete(j.lease))
            .collect(),
    )
    .await;

    // A page of the job list (SPEC M7), newest first, then one filtered by state.
    let (n, ()) = measured(lab, generic, async move |b| {
        let page = b.list_jobs(q, &JobFilter::all(), None, 50).await.unwrap();
        assert_eq!(page.jobs.len(), 50);
    })
    .await;
    read("list_jobs, a page of 50", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        let all = JobFilter::all().state(JobState::Ready);
        assert_eq!(b.list_jobs(q, &all, None, 50).await.unwrap().jobs.len(), 50);
    })
    .await;
    read("list_jobs of ready jobs, a page of 50", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        assert_eq!(b.delete_jobs(q, &done).await.unwrap(), 5);
    })
    .await;
    read("delete_jobs of 5", n);
    let (n, ()) = measured(lab, generic, async move |b| {
        assert_eq!(b.run_now(q, &later).await.unwrap(), 10);
    })
    .await;
    read("run_now of 10", n);

    // Maintenance: expiry and pruning, with nothing past retention.
    let (n, ()) = measured(lab, generic, async move |b| {
        b.maintain(q, Duration::from_secs(3600)).await.unwrap();
    })
    .await;
    read("maintenance pass", n);

    // Limit keys (SPEC K4): a hot key of limit 1 with 12,000 jobs waiting ahead of 100
    // keys with 3 jobs each. Claims park the hot key's jobs they read (each once, a
    // bounded number per claim); then a claim reads the other keys' jobs only, and a
    // settle of the hot key's running job puts back one parked job.
    let kq = &format!("{q}-keys{tag}");
    lab.b.set_key_limit(kq, None, Some(2)).await.unwrap();
    lab.b.set_key_limit(kq, Some("hot"), Some(1)).await.unwrap();
    for _ in 0..12 {
        let hot = (0..1000).map(|_| NewJob::new(kq, b"hot".to_vec()).limit_key("hot"));
        lab.b.enqueue(hot.collect()).await.unwrap();
    }
    // Each new job counts the 64 of its key ahead of it and is parked (SPEC K4).
    let (n, ()) = measured(lab, generic, async move |b| {
        let hot = (0..100).map(|_| NewJob::new(kq, b"hot".to_vec()).limit_key("hot"));
        b.enqueue(hot.collect()).await.unwrap();
    })
    .await;
    read("enqueue of 100 jobs of a key with 12,000 waiting", n);
    let mut hot_lease = None;
    for _ in 0..20 {
        for j in claim(&lab.b, kq, 10, LEASE).await {
            hot_lease = Some(j.lease);
        }
    }
    let cold =
        (0..300).map(|i| NewJob::new(kq, b"cold".to_vec()).limit_key(format!("c{}", i % 100)));
    lab.b.enqueue(cold.collect()).await.unwrap();
    let (n, got) = measured(lab, generic, async move |b| claim(b, kq, 10, LEASE).await).await;
    read("keyed claim of 10 past 12,000 parked jobs of a full key", n);
    assert_eq!(got.len(), 10, "the other keys' jobs are claimed");
    assert!(
        got.iter().all(|j| j.payload == b"cold"),
        "only the other keys' jobs"
    );
    let hot_lease = hot_lease.expect("the hot key's first job was claimed");
    let (n, ()) = measured(lab, generic, async move |b| {
        settle(b, vec![Settle::complete(hot_lease)]).await;
    })
    .await;
    read("settle of a full key's job, putting one parked job back", n);
    let (n, got) = measured(lab, generic, async move |b| claim(b, kq, 10, LEASE).await).await;
    read("keyed claim of 10 after a slot freed", n);
    assert_eq!(
        got.iter().filter(|j| j.payload == b"hot").count(),
        1,
        "the hot key's next job runs once its slot freed"
    );

    // An enqueue into a queue of many keys with a few jobs each (SPEC K4): each new
    // job's count of its key's jobs ahead reads those few, never the queue's.
    let mq = &format!("{q}-manykeys{tag}");
    lab.b.set_key_limit(mq, None, Some(2)).await.unwrap();
    for round in 0..20 {
        let jobs = (0..1000)
            .map(|i| NewJob::new(mq, vec![]).limit_key(format!("m{}", (round * 1000 + i) % 5000)));
        lab.b.enqueue(jobs.collect()).await.unwrap();
    }
    let (n, ()) = measured(lab, generic, async move |b| {
        let jobs = (0..100).map(|i| NewJob::new(mq, vec![]).limit_key(format!("m{i}")));
        b.enqueue(jobs.collect()).await.unwrap();
    })
    .await;
    read("enqueue of 100 jobs into 20,000 over 5,000 keys", n);

    // Key rates (SPEC K12, K13): every key may start one job an hour, and a hot key has
    // 12,000 jobs ahead of 100 keys with 3 jobs each. Claims park the hot key's jobs
    // for its rate (each once, a bounded number per claim); then a claim reads the
    // other keys' first jobs only.
    let rq = &format!("{q}-krates{tag}");
    let hourly = relayq_core::Rate::new(1, Duration::from_secs(3600));
    lab.b.set_key_rate(rq, None, Some(hourly)).await.unwrap();
    for _ in 0..12 {
        let hot = (0..1000).map(|_| NewJob::new(rq, b"hot".to_vec()).limit_key("hot"));
        lab.b.enqueue(hot.collect()).await.unwrap();
    }
    for _ in 0..20 {
        claim(&lab.b, rq, 10, LEASE).await;
    }
    let cold =
        (0..300).map(|i| NewJob::new(rq, b"cold".to_vec()).limit_key(format!("c{}", i % 100)));
    lab.b.enqueue(cold.collect()).await.unwrap();
    let (n, got) = measured(lab, generic, async move |b| claim(b, rq, 10, LEASE).await).await;
    read(
        "keyed claim of 10 past 12,000 jobs parked for their key's rate",
        n,
    );
    assert_eq!(got.len(), 10, "the other keys' first jobs are claimed");
    assert!(
        got.iter().all(|j| j.payload == b"cold"),
        "only the other keys' jobs"
    );
    out
}

async fn claim(b: &PostgresBackend, q: &str, n: u32, lease: Duration) -> Vec<ClaimedJob> {
    b.claim(ClaimRequest::new(q, "w", n, lease)).await.unwrap()
}

async fn settle(b: &PostgresBackend, settles: Vec<Settle>) {
    for r in b.settle_many(settles).await.unwrap() {
        r.unwrap();
    }
}

async fn progress(b: &PostgresBackend, batch: &Batch) {
    b.batch_progress(batch).await.unwrap();
    b.wait(batch, WaitFor::Stage(100), Duration::from_secs(5))
        .await
        .unwrap();
}

/// Polls until the leases of `jobs` have expired by the server's clock.
async fn expired(b: &PostgresBackend, jobs: &[ClaimedJob]) {
    let ids: Vec<i64> = jobs.iter().map(|j| j.lease.job.0).collect();
    let sql = format!(
        "SELECT bool_and(lease_expires_at < now()) FROM \"{}\".jobs WHERE id = ANY($1)",
        b.schema()
    );
    poll_until("leases to expire", Duration::from_secs(10), || {
        let (pool, sql, ids) = (b.pool().clone(), sql.clone(), ids.clone());
        async move {
            let done: Option<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(ids)
                .fetch_one(&pool)
                .await?;
            Ok(done.filter(|d| *d))
        }
    })
    .await
    .unwrap();
}

/// A backend of the lab's, planning as `generic` says.
async fn session(url: &str, schema: &str, generic: bool) -> PostgresBackend {
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    let mut url = format!("{url}&options=-c%20plan_cache_mode%3D{mode}");
    // For finding the statement that read too much: its plans in the server's log.
    if std::env::var_os("RELAYQ_TEST_AUTO_EXPLAIN").is_some() {
        url.push_str(
            "%20-c%20session_preload_libraries%3Dauto_explain\
             %20-c%20auto_explain.log_min_duration%3D0\
             %20-c%20auto_explain.log_analyze%3Don\
             %20-c%20auto_explain.log_nested_statements%3Don",
        );
    }
    let config = Config::default()
        .with_schema(schema.to_owned())
        .with_max_connections(2);
    PostgresBackend::connect_with(&url, config).await.unwrap()
}

/// Runs `op` on a backend of its own, planning as `generic` says, and returns the
/// live rows it read. A backend reports its counters at the end of a transaction at
/// most once a second, and always when it exits: so every other connection of the
/// test is closed first, and the counters are read once the backend has exited.
async fn measured<T>(
    lab: &mut Lab,
    generic: bool,
    op: impl AsyncFnOnce(&PostgresBackend) -> T,
) -> (i64, T) {
    let schema = lab.reader.schema().to_owned();
    lab.b.pool().close().await;
    ended(lab).await;
    let before = reads(&lab.reader).await;
    let b = session(&lab.url, &schema, generic).await;
    let out = op(&b).await;
    b.pool().close().await;
    ended(lab).await;
    let read = reads(&lab.reader).await - before;
    lab.b = session(&lab.url, &schema, false).await;
    (read, out)
}

/// Polls until no connection of the lab's is left but idle listeners, which read no
/// table.
async fn ended(lab: &Lab) {
    poll_until(
        "the lab's connections to end",
        Duration::from_secs(30),
        || {
            let (pool, tag) = (lab.reader.pool().clone(), lab.tag.clone());
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND query NOT LIKE 'LISTEN%'",
                )
                .bind(tag)
                .fetch_one(&pool)
                .await?;
                Ok((n == 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

/// Live rows read, by sequential scans and through indexes, over the schema's
/// tables. Index entries of dead rows are not counted: how many of those a scan meets
/// depends on vacuum and on other transactions, not on the plan.
async fn reads(b: &PostgresBackend) -> i64 {
    let per_table: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, seq_tup_read, COALESCE(idx_tup_fetch, 0)
         FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY relname",
    )
    .bind(b.schema())
    .fetch_all(b.pool())
    .await
    .unwrap();
    if std::env::var_os("RELAYQ_TEST_AUTO_EXPLAIN").is_some() {
        eprintln!("reads: {per_table:?}");
    }
    per_table.iter().map(|(_, seq, idx)| seq + idx).sum()
}

relayq_conformance::server_tests! {
    server: common::SERVER,
    tests: [
        hot_statements_read_little_never_analyzed,
        hot_statements_read_little_analyzed_empty_then_filled,
        hot_statements_read_little_analyzed_full_then_emptied,
        hot_statements_read_little_analyzed_with_giant_groups,
    ],
}
