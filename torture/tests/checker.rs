//! The checker on hand-made ledgers: a clean history passes, and each kind of
//! violation planted in it is reported (so a real one would fail the run).

use chrono::{DateTime, TimeZone, Utc};
use relayq::{AttemptOutcome, AttemptRecord, JobId, JobInfo, JobState, QueueStats};
use relayq_torture::{
    check::{Allowances, Observed, Report, check, names},
    ledger::Ledger,
    plan::{Mode, Plan, PlannedBatch, PlannedJob},
};

fn at(us: i64) -> DateTime<Utc> {
    Utc.timestamp_micros(us).single().expect("a valid time")
}

fn job(key: &str) -> PlannedJob {
    PlannedJob {
        key: key.into(),
        mode: Mode::Ok,
        sleep_ms: 10,
        max_attempts: 5,
        group: None,
        batch: None,
        delay_ms: 0,
        dedupe: false,
        cancel: false,
        limit_key: None,
        after: Vec::new(),
    }
}

/// A succeeded job whose attempts ran over `spans` (µs), the last one succeeding.
fn info(id: i64, spans: &[(i64, i64)]) -> JobInfo {
    let attempt_log: Vec<AttemptRecord> = spans
        .iter()
        .enumerate()
        .map(|(n, &(s, e))| AttemptRecord {
            attempt: u32::try_from(n).unwrap() + 1,
            worker: "w".into(),
            started_at: at(s),
            claimed_at: Some(at(s)),
            ended_at: Some(at(e)),
            outcome: if n + 1 == spans.len() {
                AttemptOutcome::Succeeded
            } else {
                AttemptOutcome::Failed
            },
            error: None,
            output: None,
        })
        .collect();
    JobInfo {
        id: JobId(id),
        queue: "torture".into(),
        state: JobState::Succeeded,
        payload: Vec::new(),
        priority: 0,
        run_at: at(0),
        attempts: u32::try_from(spans.len()).unwrap(),
        max_attempts: 5,
        group: None,
        batch: None,
        stage: None,
        dedupe_key: None,
        enqueued_by: None,
        created_at: at(0),
        finished_at: spans.last().map(|&(_, e)| at(e + 1)),
        last_error: None,
        attempt_log,
        progress: None,
        limit_key: None,
        after: Vec::new(),
    }
}

/// k0, k1 in group g0; k2 at stage 100 and k3 at stage 200 of batch 0: a clean history
/// whose database view matches `ledger`.
fn scenario(ledger: &str, infos: Vec<JobInfo>) -> Report {
    scenario_keyed(ledger, infos, &[])
}

/// [`scenario`] with limit keys on some jobs: (plan index, key).
fn scenario_keyed(ledger: &str, infos: Vec<JobInfo>, keys: &[(usize, &'static str)]) -> Report {
    scenario_with(ledger, infos, keys, false)
}

/// [`scenario_keyed`], with k3 running after k2 when `after` (SPEC D).
fn scenario_with(
    ledger: &str,
    infos: Vec<JobInfo>,
    keys: &[(usize, &'static str)],
    after: bool,
) -> Report {
    let mut jobs = vec![job("k0"), job("k1"), job("k2"), job("k3")];
    if after {
        jobs[3].after = vec![2];
    }
    for &(i, key) in keys {
        jobs[i].limit_key = Some(key);
    }
    jobs[0].group = Some("g0".into());
    jobs[1].group = Some("g0".into());
    jobs[2].batch = Some((0, 100));
    jobs[3].batch = Some((0, 200));
    let plan = Plan {
        jobs,
        batches: vec![PlannedBatch {
            halt: true,
            stages: vec![100, 200],
        }],
    };
    let mut stats = QueueStats::default();
    for i in &infos {
        *stats.counts.entry(i.state).or_default() += 1;
    }
    let obs = Observed {
        ids: (0..4).map(|i| Some(JobId(i + 1))).collect(),
        jobs: infos.into_iter().map(Some).collect(),
        stats,
        ..Observed::default()
    };
    check(&plan, &obs, &Ledger::parse(ledger), Allowances::default())
}

const CLEAN: &str = "\
S k0 1 1000\nE k0 1 2000 0\n\
S k1 2 3000\nE k1 2 4000 0\n\
S k2 3 1000\nE k2 3 1500 0\n\
S k3 4 2000\nE k3 4 2500 0\n";

fn clean_infos() -> Vec<JobInfo> {
    vec![
        info(1, &[(900, 2100)]),
        info(2, &[(2900, 4100)]),
        info(3, &[(900, 1600)]),
        info(4, &[(1900, 2600)]),
    ]
}

#[test]
fn a_clean_history_passes() {
    let r = scenario(CLEAN, clean_infos());
    assert_eq!(r.violations(), 0, "{:#?}", r.checks);
}

#[test]
fn a_group_overlap_is_reported() {
    // k1 starts while k0 still runs.
    let ledger = CLEAN.replace("S k1 2 3000", "S k1 2 1500");
    let r = scenario(&ledger, clean_infos());
    assert_eq!(r.check(names::GROUP_OVERLAP).violations.len(), 1, "{r:#?}");
    assert_eq!(r.check(names::GROUP_ORDER).violations.len(), 1, "{r:#?}");
}

#[test]
fn a_stage_barrier_violation_is_reported() {
    // k3 (stage 200) starts before k2 (stage 100) ended, in the ledger and in the log.
    let ledger = CLEAN.replace("S k3 4 2000", "S k3 4 1200");
    let mut infos = clean_infos();
    infos[3] = info(4, &[(1100, 2600)]);
    let r = scenario(&ledger, infos);
    assert_eq!(r.check(names::BARRIER).violations.len(), 2, "{r:#?}");
}

#[test]
fn a_job_started_before_the_job_it_runs_after_is_reported() {
    assert_eq!(
        scenario_with(CLEAN, clean_infos(), &[], true).violations(),
        0
    );
    // k3 (after k2) starts before k2 ended, in the ledger and in the log.
    let ledger = CLEAN.replace("S k3 4 2000", "S k3 4 1200");
    let mut infos = clean_infos();
    infos[3] = info(4, &[(1100, 2600)]);
    let r = scenario_with(&ledger, infos, &[], true);
    assert_eq!(r.check(names::AFTER).violations.len(), 2, "{r:#?}");
    // k2 ended dead, yet k3 ran.
    let mut infos = clean_infos();
    infos[2].state = JobState::Dead;
    let r = scenario_with(CLEAN, infos, &[], true);
    assert_eq!(r.check(names::AFTER).violations.len(), 1, "{r:#?}");
}

#[test]
fn a_claim_before_the_earlier_finish_is_reported_whenever_the_handler_started() {
    // k1 claimed at 1500, while k0 ran (finished 2100), but its handler started at
    // 2900 after a wait in the buffer; k3 (stage 200) claimed before k2 finished.
    let mut infos = clean_infos();
    infos[1].attempt_log[0].claimed_at = Some(at(1500));
    infos[3].attempt_log[0].claimed_at = Some(at(1200));
    let r = scenario(CLEAN, infos);
    assert_eq!(r.check(names::GROUP_ORDER).violations.len(), 1, "{r:#?}");
    assert_eq!(r.check(names::BARRIER).violations.len(), 1, "{r:#?}");
}

#[test]
fn a_completion_accepted_twice_is_reported() {
    let mut infos = clean_infos();
    infos[2].attempt_log[0].outcome = AttemptOutcome::Succeeded;
    let mut second = infos[2].attempt_log[0].clone();
    second.attempt = 2;
    infos[2].attempt_log.push(second);
    let r = scenario(CLEAN, infos);
    assert_eq!(r.check(names::ONCE).violations.len(), 1, "{r:#?}");
}

#[test]
fn overlapping_attempts_and_lock_alarms_are_reported() {
    // A second run of k2 while the first still ran, and an alarm from the lock.
    let ledger = format!("{CLEAN}S k2 9 1200\nE k2 9 1400 0\nX k2 9 1199 job\n");
    let mut infos = clean_infos();
    infos[2] = info(3, &[(900, 1300), (1100, 1600)]);
    let r = scenario(&ledger, infos);
    assert_eq!(r.check(names::ATTEMPTS).violations.len(), 2, "{r:#?}");
}

#[test]
fn lost_stuck_and_miscounted_jobs_are_reported() {
    let mut infos = clean_infos();
    infos[1].state = JobState::Running;
    let r = scenario(CLEAN, infos);
    assert_eq!(r.check(names::STUCK).violations.len(), 1);
    assert_eq!(r.check(names::STATES).violations.len(), 1);
    // A job the ledger never saw run cannot have succeeded.
    let r = scenario(
        &CLEAN.replace("E k0 1 2000 0", "E k0 1 2000 1"),
        clean_infos(),
    );
    assert_eq!(r.check(names::RAN).violations.len(), 1, "{r:#?}");
}

/// Two jobs of a key of limit 1 that overlap, in the ledger and in the database, are
/// both reported; the same overlap under a key of limit 3, or spans that only touch,
/// are not.
#[test]
fn an_overlap_within_a_limit_key_is_reported() {
    use relayq_torture::keys::names as keys;
    // k0 ran 1000..2000 and k2 1000..1500: together, under lk1.
    let r = scenario_keyed(CLEAN, clean_infos(), &[(0, "lk1"), (2, "lk1")]);
    assert_eq!(r.check(keys::RUNS).violations.len(), 1, "{:#?}", r.checks);
    assert_eq!(r.check(keys::CLAIMS).violations.len(), 1, "{:#?}", r.checks);
    let r = scenario_keyed(CLEAN, clean_infos(), &[(0, "lk3"), (2, "lk3")]);
    assert_eq!(r.violations(), 0, "{:#?}", r.checks);
    // k2 ended at 1500 (ledger) and k3 started at 2000: one after the other.
    let r = scenario_keyed(CLEAN, clean_infos(), &[(2, "lk1"), (3, "lk1")]);
    assert_eq!(r.violations(), 0, "{:#?}", r.checks);
    assert!(r.check(keys::RUNS).checked >= 2);
}
