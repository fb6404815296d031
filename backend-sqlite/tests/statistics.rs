//! Every hot statement finds its rows by key, whatever SQLite's statistics say, so a
//! queue drained, analyzed and filled again is not read whole on every call.
//!
//! After `ANALYZE` (or `PRAGMA optimize`) SQLite's planner weighs its choices with
//! `sqlite_stat1` and `sqlite_stat4`: a drained queue analyzed while its claim index
//! was empty, or a queue analyzed full and then drained, is planned for the table it
//! was, not the one it is. Each test here puts the file in one statistics state with
//! 50,000 jobs where the statements can see them, then checks two things:
//!
//! - the plan (`EXPLAIN QUERY PLAN`) of every statement the backend lists in
//!   `hot_statements()`, bound with values of the state's own queue, groups and batch
//!   (the bundled SQLite has STAT4, which plans with bound values): no full scan of
//!   `relayq_jobs` or `relayq_attempts`, and the index the statement is meant to use;
//! - the virtual machine steps each hot operation takes, counted by a progress
//!   handler called at every step: a scan of the queue takes at least one step per
//!   row, so an operation that touches a hundred jobs and scans takes ten times what
//!   it should. (sqlx does not expose `sqlite3_stmt_status`; the progress handler
//!   counts the same steps as its `SQLITE_STMTSTATUS_VM_STEP`.)
//!
//! Not a timed test.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering::Relaxed},
};
use std::time::Duration;

use chrono::Utc;
use relayq_conformance::{poll_until, queue_name};
use relayq_core::{
    Admin, Batch, Claim, ClaimRequest, ClaimedJob, Complete, Enqueue, Inspect, JobFilter, JobState,
    NewJob, OnFailure, OrderBarrier, OrderBarrierExt, Retry, Settle, WaitFor,
};
use relayq_sqlite::{Param, SqliteBackend, hot_statements};
use sqlx::sqlite::SqliteArguments;

/// The rows no hot statement may walk.
const BIG: usize = 50_000;
/// Steps allowed to one operation: each touches at most a hundred jobs, at most a
/// few hundred steps each (a claimed row's eleven columns, an update of seven
/// indexes). A scan of the queue takes `BIG` steps at the least.
const ALLOWED: u64 = 40_000;
const LEASE: Duration = Duration::from_secs(60);

/// The states of the planner's statistics the issue names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stats {
    /// A large table that was never analyzed.
    Never,
    /// `ANALYZE` on the new, empty tables, then filled.
    EmptyThenFilled,
    /// `ANALYZE` with a handful of jobs, then filled. On SQLite this is the
    /// statistics' "nearly empty": an index of an empty table gets no `sqlite_stat1`
    /// row for the table, and the planner then assumes a million rows, while a few
    /// rows analyzed say the table holds a few.
    TinyThenFilled,
    /// Filled, drained, analyzed, filled again: the issue's scenario. The drained
    /// jobs stay in `relayq_jobs` (as succeeded) until retention prunes them, so the
    /// statistics describe a table of finished jobs with an empty claim index.
    DrainedThenFilled,
    /// Analyzed full, then drained, then a few thousand enqueued.
    FullThenEmptied,
    /// SQLite's own way of gathering statistics: filled, drained, `PRAGMA optimize`
    /// (which analyzes the tables that changed, and skips empty ones), filled again.
    OptimizedAfterDrain,
    /// Analyzed with two groups of 20,000 jobs and a batch stage of 10,000.
    GiantGroups,
}

#[tokio::test]
async fn never_analyzed() {
    check(Stats::Never).await;
}

#[tokio::test]
async fn analyzed_empty_then_filled() {
    check(Stats::EmptyThenFilled).await;
}

#[tokio::test]
async fn analyzed_tiny_then_filled() {
    check(Stats::TinyThenFilled).await;
}

#[tokio::test]
async fn analyzed_drained_then_filled() {
    check(Stats::DrainedThenFilled).await;
}

#[tokio::test]
async fn analyzed_full_then_emptied() {
    check(Stats::FullThenEmptied).await;
}

#[tokio::test]
async fn optimized_after_drain() {
    check(Stats::OptimizedAfterDrain).await;
}

#[tokio::test]
async fn analyzed_with_giant_groups() {
    check(Stats::GiantGroups).await;
}

/// One database file in one statistics state.
struct Lab {
    _dir: tempfile::TempDir,
    url: String,
    b: SqliteBackend,
    q: String,
    /// Virtual machine steps of the backend's connections since the last reset.
    steps: Arc<AtomicU64>,
}

async fn check(stats: Stats) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("stats.db").display());
    let b = SqliteBackend::open(&url).await.unwrap();
    let mut lab = Lab {
        _dir: dir,
        url,
        b,
        q: queue_name("stats"),
        steps: Arc::default(),
    };
    match stats {
        Stats::Never => fill(&lab, BIG).await,
        Stats::EmptyThenFilled => {
            analyze(&lab, "ANALYZE").await;
            fill(&lab, BIG).await;
        }
        Stats::TinyThenFilled => {
            fill(&lab, 10).await;
            let got = claim(&lab.b, &lab.q, 5, LEASE).await;
            settle(&lab.b, got.into_iter().map(|j| Settle::complete(j.lease))).await;
            analyze(&lab, "ANALYZE").await;
            fill(&lab, BIG).await;
        }
        Stats::DrainedThenFilled => {
            fill(&lab, BIG).await;
            drain(&lab).await;
            analyze(&lab, "ANALYZE").await;
            fill(&lab, BIG).await;
        }
        Stats::FullThenEmptied => {
            fill(&lab, BIG).await;
            analyze(&lab, "ANALYZE").await;
            drain(&lab).await;
            fill(&lab, 2_000).await;
        }
        Stats::OptimizedAfterDrain => {
            fill(&lab, BIG).await;
            drain(&lab).await;
            // 0x10002: analyze every table that needs it, not only those this
            // connection's queries used.
            analyze(&lab, "PRAGMA optimize = 0x10002").await;
            fill(&lab, BIG).await;
        }
        Stats::GiantGroups => {
            fill_giant(&lab).await;
            analyze(&lab, "ANALYZE").await;
        }
    }
    let stat1: Vec<(String, Option<String>, String)> =
        sqlx::query_as("SELECT tbl, idx, stat FROM sqlite_stat1 ORDER BY tbl, idx")
            .fetch_all(lab.b.pool())
            .await
            .unwrap_or_default();
    eprintln!("{stats:?}: sqlite_stat1 {stat1:?}");
    assert_eq!(stat1.is_empty(), stats == Stats::Never, "{stats:?}");
    // Connections load the statistics when they read the schema: a fresh pool sees
    // what the state left, as a restarted worker would.
    lab.b.pool().close().await;
    lab.b = SqliteBackend::open(&lab.url).await.unwrap();
    count_steps(&lab).await;

    let mut failures = plans(&lab, stats).await;
    for (what, steps) in operations(&lab).await {
        eprintln!("{stats:?}: {what}: {steps} steps");
        if steps > ALLOWED {
            failures.push(format!("{what} took {steps} steps"));
        }
    }
    assert!(failures.is_empty(), "{stats:?}:\n{}", failures.join("\n"));
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

/// Two groups of 20,000 jobs and a batch whose one stage holds 10,000.
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
    // settles below fail some of its jobs. What this batch is for is a big stage index.
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
async fn drain(lab: &Lab) {
    loop {
        let got = claim(&lab.b, &lab.q, 1_000, LEASE).await;
        if got.is_empty() {
            return;
        }
        settle(&lab.b, got.into_iter().map(|j| Settle::complete(j.lease))).await;
    }
}

async fn analyze(lab: &Lab, sql: &'static str) {
    sqlx::raw_sql(sql).execute(lab.b.pool()).await.unwrap();
}

/// Installs a progress handler called at every virtual machine step on each of the
/// backend's connections (it opens at most four).
async fn count_steps(lab: &Lab) {
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut conn = lab.b.pool().acquire().await.unwrap();
        let steps = lab.steps.clone();
        conn.lock_handle()
            .await
            .unwrap()
            .set_progress_handler(1, move || {
                steps.fetch_add(1, Relaxed);
                true
            });
        conns.push(conn);
    }
}

/// Runs `op` and returns the steps it took with its result.
async fn steps<T>(lab: &Lab, op: impl AsyncFnOnce(&SqliteBackend) -> T) -> (u64, T) {
    lab.steps.store(0, Relaxed);
    let out = op(&lab.b).await;
    let n = lab.steps.load(Relaxed);
    // Zero would mean a connection without the handler: the pool opened a new one.
    assert!(n > 0, "no step counted");
    (n, out)
}

/// Checks the plan of every hot statement; returns what failed.
async fn plans(lab: &Lab, stats: Stats) -> Vec<String> {
    let q = &lab.q;
    let head = claim(&lab.b, q, 100, LEASE).await;
    let job = head[0].lease.job.0;
    let leases: Vec<_> = head
        .iter()
        .map(|j| serde_json::json!([j.lease.job.0, j.lease.token.0.simple().to_string(), q, null]))
        .collect();
    let leases = serde_json::Value::Array(leases).to_string();
    let new_jobs: Vec<_> = (0..100)
        .map(|i| serde_json::json!(["ready", "00", 0, i, 3, null, null, null, null]))
        .collect();
    let new_jobs = serde_json::Value::Array(new_jobs).to_string();
    let (batch, stage, group) = if stats == Stats::GiantGroups {
        let batch: i64 = sqlx::query_scalar("SELECT max(id) FROM relayq_batches")
            .fetch_one(lab.b.pool())
            .await
            .unwrap();
        (batch, 900, "giant-a")
    } else {
        (1, 0, "none")
    };
    let now = Utc::now().timestamp_micros();
    let mut failures = Vec::new();
    for hot in hot_statements() {
        let mut args = SqliteArguments::default();
        for p in hot.params {
            use sqlx::Arguments as _;
            match p {
                Param::Queue => args.add(q.clone()),
                Param::Job => args.add(job),
                Param::Token => args.add(uuid::Uuid::new_v4().as_bytes().to_vec()),
                Param::Now => args.add(now),
                Param::Later => args.add(now + 60_000_000),
                Param::Batch => args.add(batch),
                Param::Stage => args.add(stage),
                Param::Group => args.add(group),
                Param::Limit => args.add(100_i64),
                Param::Text => args.add("x"),
                Param::Leases => args.add(leases.clone()),
                Param::NewJobs => args.add(new_jobs.clone()),
                Param::Keys => args.add(r#"["k1","k2"]"#),
                Param::Jobs => args.add(format!("[{job}]")),
                Param::Rows => args.add(format!("[[{job}, 1, null]]")),
            }
            .unwrap();
        }
        let explain = format!("EXPLAIN QUERY PLAN {}", hot.sql);
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as_with(sqlx::AssertSqlSafe(explain), args)
                .fetch_all(lab.b.pool())
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", hot.name));
        let plan: Vec<String> = plan.into_iter().map(|r| r.3).collect();
        eprintln!("{stats:?}: {}: {plan:?}", hot.name);
        if let Err(why) = judge(hot.name, &plan) {
            failures.push(format!("{}: {why}: {plan:?}", hot.name));
        }
    }
    settle(&lab.b, head.into_iter().map(|j| Settle::release(j.lease))).await;
    failures
}

/// Whether `plan` reads `relayq_jobs` and `relayq_attempts` by key only, through
/// the index `name` is meant to use.
fn judge(name: &str, plan: &[String]) -> Result<(), String> {
    for line in plan {
        let scan = line.starts_with("SCAN ");
        // The leases or new jobs of the call, a JSON array.
        let input = line.contains("VIRTUAL TABLE");
        // One row per queue; pruned batches are sealed and empty (see
        // admin::PRUNE_BATCHES).
        let tiny =
            line.starts_with("SCAN relayq_batches") || line.starts_with("SCAN relayq_queues");
        // A subquery's own rows, at most its `LIMIT` (enqueue::PARK_NEW counts 64 ahead).
        let bounded = line.starts_with("SCAN (subquery-") && name == "enqueue::PARK_NEW"
            // The children of the parents given, counted by a co-routine.
            || line == "SCAN c" && name == "after::COUNT_OFF";
        let allowed = input || bounded || (tiny && name == "admin::PRUNE_BATCHES");
        if scan && !allowed {
            return Err(format!("scans: {line}"));
        }
        // Sorting the rows a claim or a group's head could take means reading all of
        // them: the index gives them in order.
        if line.contains("TEMP B-TREE FOR ORDER BY") && name != "enqueue::INSERT_ALL" {
            return Err(format!("sorts: {line}"));
        }
    }
    // In order: a join's outer loop comes first.
    let mut lines = plan.iter();
    for want in expected(name) {
        if !lines.any(|l| l.contains(want)) {
            return Err(format!("does not {want} (in this order)"));
        }
    }
    Ok(())
}

/// The look-ups each statement must make, in plan order: its rows found by key,
/// through the index made for it. A statement the test does not know fails it.
fn expected(name: &str) -> &'static [&'static str] {
    const PK: &str = "SEARCH relayq_jobs USING INTEGER PRIMARY KEY (rowid=?)";
    const BATCH_PK: &str = "SEARCH relayq_batches USING INTEGER PRIMARY KEY (rowid=?)";
    const BY_LEASE: &[&str] = &[
        "SCAN l VIRTUAL TABLE",
        "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)",
    ];
    const STATE: &str = "INDEX relayq_jobs_state (queue=? AND state=? AND finished_at<?)";
    const PK_J: &str = "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)";
    const BATCH_PK_B: &str = "SEARCH b USING INTEGER PRIMARY KEY (rowid=?)";
    match name {
        "claim::QUEUE_SETTINGS" | "claim::RATE_TAT" => {
            &["INDEX sqlite_autoindex_relayq_queues_1 (queue=?)"]
        }
        "claim::RUNNING_COUNT" => &["INDEX relayq_jobs_running (queue=?)"],
        // The claimed rows are then found by the upsert's conflict check, a seek
        // that is no part of the plan.
        "claim::CLAIM" | "claim::CANDIDATES" => &["INDEX relayq_jobs_claim (queue=?)"],
        "claim::KEY_INFO" => &[
            "SCAN l VIRTUAL TABLE",
            "SEARCH relayq_key_limits USING PRIMARY KEY (queue=? AND limit_key=?)",
            "INDEX sqlite_autoindex_relayq_queues_1 (queue=?)",
            "INDEX relayq_jobs_key_running (queue=? AND limit_key=?)",
        ],
        "claim::PARK" | "claim::CLAIM_IDS" => BY_LEASE,
        "claim::KEY_RATES" => &[
            "SCAN l VIRTUAL TABLE",
            "SEARCH r USING PRIMARY KEY (queue=? AND limit_key=?)",
        ],
        "claim::WOKEN" => &["INDEX relayq_key_rates_wake (queue=? AND wake_at<?)"],
        "claim::NEXT_WAKE" => &["INDEX relayq_key_rates_wake (queue=? AND wake_at>?)"],
        "claim::WAKE_DONE" => {
            &["SEARCH relayq_key_rates USING PRIMARY KEY (queue=? AND limit_key=?)"]
        }
        "claim::UNPARK_FIRST" => &["INDEX relayq_jobs_parked (queue=? AND limit_key=?)"],
        "claim::STILL_PARKED" => &[
            "SEARCH relayq_key_rates USING PRIMARY KEY (queue=? AND limit_key=?)",
            "INDEX relayq_jobs_parked (queue=? AND limit_key=?)",
        ],
        "claim::EXPIRED" => &["INDEX relayq_jobs_running (queue=? AND lease_expires_at<?)"],
        "claim::EXPIRE_ONE"
        | "settle::COMPLETE"
        | "settle::FAIL"
        | "settle::RELEASE"
        | "settle::HEARTBEAT"
        | "promote::GROUP_PROMOTE" => &[PK],
        "settle::LOG_COMPLETED" | "settle::COMPLETE_ALL" | "settle::LOST" | "settle::PROGRESS" => {
            BY_LEASE
        }
        "promote::STAGE_BELOW" => &["INDEX relayq_jobs_stage (batch_id=? AND stage<?)"],
        "promote::HALT_BATCH"
        | "promote::RAISE_STAGE"
        | "enqueue::OPEN_BATCH_STAGE"
        | "barrier::BATCH_SETTINGS" => &[BATCH_PK],
        "promote::HALT_JOBS" => &["INDEX relayq_jobs_stage (batch_id=? AND stage>?)"],
        "promote::STAGE_FLOOR" => &["INDEX relayq_jobs_stage (batch_id=?)"],
        "promote::RELEASE_UNGROUPED"
        | "promote::STAGE_GROUPS"
        | "promote::HALT_LOG"
        | "promote::HALT_GROUPS"
        | "promote::HALT_STAGE" => &["INDEX relayq_jobs_stage (batch_id=? AND stage=?)"],
        "promote::GROUP_BUSY" | "promote::GROUP_DEMOTE" => {
            &["INDEX relayq_jobs_holder (queue=? AND group_key=?)"]
        }
        "promote::GROUP_HEAD" => &[
            "SEARCH j USING INDEX relayq_jobs_group (queue=? AND group_key=?)",
            "SEARCH s USING INDEX relayq_jobs_stage (batch_id=?)",
        ],
        "enqueue::KEYED" => &[
            "INDEX sqlite_autoindex_relayq_queues_1 (queue=?)",
            "SEARCH relayq_key_limits USING PRIMARY KEY (queue=?)",
        ],
        "enqueue::PARK_NEW" => &[
            "SCAN n VIRTUAL TABLE",
            "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)",
            "SEARCH a USING INDEX relayq_jobs_key_waiting (queue=? AND limit_key=?",
        ],
        "after::CANCEL_CHILDREN" => &["SEARCH d USING PRIMARY KEY (parent_id=?)", PK_J],
        "after::COUNT_OFF" => &[
            "SCAN p VIRTUAL TABLE",
            "SEARCH d USING PRIMARY KEY (parent_id=?)",
            "SCAN c",
            PK_J,
        ],
        "after::READY" => &["SCAN f VIRTUAL TABLE", PK_J, BATCH_PK_B],
        "after::PARENTS" => &["SCAN p VIRTUAL TABLE", PK_J],
        "after::SET_WAITS" | "after::SET_CANCELLED" => &["SCAN w VIRTUAL TABLE", PK_J],
        "admin::PRUNE_EDGES" => &[
            "SEARCH relayq_job_deps USING COVERING INDEX relayq_job_deps_child (child_id=?)",
            STATE,
        ],
        "enqueue::DUPLICATE" => &["INDEX relayq_jobs_dedupe (queue=? AND dedupe_key=?)"],
        "enqueue::INSERT_ALL" => &["SCAN j VIRTUAL TABLE"],
        "barrier::REACHED" => &[BATCH_PK, "INDEX relayq_jobs_stage (batch_id=?)"],
        "barrier::BATCH_COUNTS" => &["INDEX relayq_jobs_batch (batch_id=?)"],
        "admin::PRUNE_ATTEMPTS" => &[
            "SEARCH relayq_attempts USING COVERING INDEX relayq_attempts_job (job_id=?)",
            STATE,
        ],
        "admin::PRUNE_JOBS" => &[STATE],
        "admin::PRUNE_KEY_RATES" => &["SEARCH relayq_key_rates USING PRIMARY KEY (queue=?)"],
        "admin::PRUNE_BATCHES" => &[
            "SCAN relayq_batches",
            "INDEX relayq_jobs_batch (batch_id=?)",
        ],
        other => panic!("no expected plan for {other}: add one here"),
    }
}

/// Runs every hot operation once; returns the steps each took.
async fn operations(lab: &Lab) -> Vec<(&'static str, u64)> {
    let q = &lab.q.clone();
    let mut out = Vec::new();

    // Claims, and settles of every kind, of jobs at the head of the big queue.
    let (n, got) = steps(lab, async |b| claim(b, q, 100, LEASE).await).await;
    out.push(("claim of 100", n));
    let mut leases = got.into_iter().map(|j| j.lease);
    let completes: Vec<Settle> = leases.by_ref().take(50).map(Settle::complete).collect();
    // Five of them, deleted by id below (SPEC M8).
    let done: Vec<relayq_core::JobId> = completes.iter().take(5).map(|s| s.lease.job).collect();
    let (n, ()) = steps(lab, async |b| settle(b, completes).await).await;
    out.push(("settle of 50 completions", n));
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
    let (n, ()) = steps(lab, async |b| settle(b, mixed).await).await;
    out.push(("settle of 40 mixed outcomes", n));
    let lease = leases.next().unwrap();
    let (n, ()) = steps(lab, async |b| {
        b.heartbeat(&lease, LEASE).await.unwrap();
    })
    .await;
    out.push(("heartbeat", n));

    // Enqueues with dedupe keys: new keys, then the same keys again.
    let keyed = || {
        (0..100)
            .map(|i| NewJob::new(q, vec![]).dedupe_key(format!("key-{i}")))
            .collect::<Vec<_>>()
    };
    let (n, ()) = steps(lab, async |b| {
        b.enqueue(keyed()).await.unwrap();
    })
    .await;
    out.push(("enqueue of 100 with dedupe keys", n));
    let (n, ()) = steps(lab, async |b| {
        b.enqueue(keyed()).await.unwrap();
    })
    .await;
    out.push(("enqueue of 100 duplicates", n));

    // Each part below puts its jobs at the head of the queue.
    let head = -10;
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
    expired(&short).await;
    let (n, got) = steps(lab, async |b| claim(b, q, 20, LEASE).await).await;
    out.push(("claim taking over 10 expired leases, 10 made dead", n));
    assert!(got.len() >= 10, "expired jobs are claimed again");

    // A queue with a concurrency limit counts its running jobs.
    lab.b.set_max_running(q, Some(100_000)).await.unwrap();
    let (n, got) = steps(lab, async |b| claim(b, q, 50, LEASE).await).await;
    out.push(("claim of 50 in a limited queue", n));
    assert_eq!(got.len(), 50);
    lab.b.set_max_running(q, None).await.unwrap();

    // Groups: the holder finishes and the next job of its group is promoted.
    let grouped = (0..3)
        .map(|_| NewJob::new(q, vec![]).priority(head - 1).group("small"))
        .collect();
    lab.b.enqueue(grouped).await.unwrap();
    let holder = claim(&lab.b, q, 1, LEASE).await.remove(0).lease;
    let (n, ()) = steps(lab, async |b| settle(b, [Settle::complete(holder)]).await).await;
    out.push(("settle of a group's holder", n));

    // Stages: the last job of a stage finishes and releases the next; a dead job
    // halts the batch.
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
    let (n, ()) = steps(lab, async |b| settle(b, [Settle::complete(a)]).await).await;
    out.push(("settle of a stage's job with a witness left", n));
    let (n, ()) = steps(lab, async |b| settle(b, [Settle::complete(z)]).await).await;
    out.push(("settle releasing the next stage", n));
    let (n, ()) = steps(lab, async |b| progress(b, &batch).await).await;
    out.push(("batch progress and wait", n));
    let next = claim(&lab.b, q, 1, LEASE).await.remove(0).lease;
    let dead = Settle::fail(next, "dead", Retry::Never);
    let (n, ()) = steps(lab, async |b| settle(b, [dead]).await).await;
    out.push(("settle of a dead job halting its batch", n));

    // Dependencies (SPEC D): a parent whose settle releases 100 children, another
    // whose death cancels 100, and 100 jobs enqueued after a stored one.
    let graph = lab.b.open_batch(q, OnFailure::Continue).await.unwrap();
    let parent = |p: i16| NewJob::new(q, vec![]).priority(p).in_batch(graph.id, 0);
    let parents = lab
        .b
        .enqueue(vec![parent(head - 3), parent(head - 3)])
        .await
        .unwrap();
    let (n, _) = steps(lab, async |b| {
        let children = (0..100)
            .map(|i| parent(head - 2).after(parents[i % 2].id))
            .collect();
        b.enqueue(children).await.unwrap()
    })
    .await;
    out.push(("enqueue of 100 after stored jobs", n));
    let mut two = claim(&lab.b, q, 2, LEASE)
        .await
        .into_iter()
        .map(|j| j.lease);
    let (ok, bad) = (two.next().unwrap(), two.next().expect("both parents"));
    let (n, ()) = steps(lab, async |b| settle(b, [Settle::complete(ok)]).await).await;
    out.push(("settle of a parent releasing 50 children", n));
    let dead = Settle::fail(bad, "dead", Retry::Never);
    let (n, ()) = steps(lab, async |b| settle(b, [dead]).await).await;
    out.push(("settle of a dead parent cancelling 50 children", n));
    let freed = claim(&lab.b, q, 100, LEASE).await;
    assert_eq!(freed.len(), 100, "the 50 freed children, then 50 others");
    settle(&lab.b, freed.into_iter().map(|j| Settle::release(j.lease))).await;

    // A page of the job list (SPEC M7), newest first, then one filtered by state.
    let (n, ()) = steps(lab, async |b| {
        let page = b.list_jobs(q, &JobFilter::all(), None, 50).await.unwrap();
        assert_eq!(page.jobs.len(), 50);
    })
    .await;
    out.push(("list_jobs, a page of 50", n));
    let (n, ()) = steps(lab, async |b| {
        let ready = JobFilter::all().state(JobState::Ready);
        assert_eq!(
            b.list_jobs(q, &ready, None, 50).await.unwrap().jobs.len(),
            50
        );
    })
    .await;
    out.push(("list_jobs of ready jobs, a page of 50", n));
    let (n, ()) = steps(lab, async |b| {
        assert_eq!(b.delete_jobs(q, &done).await.unwrap(), 5);
    })
    .await;
    out.push(("delete_jobs of 5", n));
    let (n, ()) = steps(lab, async |b| {
        assert_eq!(b.run_now(q, &later).await.unwrap(), 10);
    })
    .await;
    out.push(("run_now of 10", n));

    // Maintenance: expiry and pruning, with nothing past retention.
    let (n, ()) = steps(lab, async |b| {
        b.maintain(q, Duration::from_secs(3600)).await.unwrap();
    })
    .await;
    out.push(("maintenance pass", n));
    out
}

async fn claim(b: &SqliteBackend, q: &str, n: u32, lease: Duration) -> Vec<ClaimedJob> {
    b.claim(ClaimRequest::new(q, "w", n, lease)).await.unwrap()
}

async fn settle(b: &SqliteBackend, settles: impl IntoIterator<Item = Settle>) {
    for r in b.settle_many(settles.into_iter().collect()).await.unwrap() {
        r.unwrap();
    }
}

async fn progress(b: &SqliteBackend, batch: &Batch) {
    b.batch_progress(batch).await.unwrap();
    b.wait(batch, WaitFor::Stage(100), Duration::from_secs(5))
        .await
        .unwrap();
}

/// Polls until the leases of `jobs` have expired by this machine's clock, the
/// backend's.
async fn expired(jobs: &[ClaimedJob]) {
    let last = jobs.iter().map(|j| j.lease.expires_at).max().unwrap();
    poll_until("leases to expire", Duration::from_secs(10), || async move {
        Ok((Utc::now() > last).then_some(()))
    })
    .await
    .unwrap();
}
