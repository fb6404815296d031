use chrono::TimeDelta;
use relayq_core::{AttemptOutcome, AttemptRecord};

use super::*;

fn at(t0: DateTime<Utc>, ms: i64) -> DateTime<Utc> {
    t0 + TimeDelta::milliseconds(ms)
}

fn attempt(
    t0: DateTime<Utc>,
    n: u32,
    from: i64,
    to: i64,
    outcome: AttemptOutcome,
) -> AttemptRecord {
    AttemptRecord {
        attempt: n,
        worker: "w1".into(),
        started_at: at(t0, from),
        claimed_at: Some(at(t0, from)),
        ended_at: Some(at(t0, to)),
        outcome,
        error: (outcome == AttemptOutcome::Failed)
            .then(|| "exit status 3\n--- output ---\nboom".into()),
        output: None,
    }
}

fn job(
    t0: DateTime<Utc>,
    id: i64,
    name: &str,
    stage: i32,
    state: JobState,
    attempts: Vec<AttemptRecord>,
) -> JobReport {
    JobReport {
        id,
        name: name.into(),
        command: format!("run {name}"),
        stage: Some(stage),
        group: None,
        state,
        max_attempts: 2,
        created_at: t0,
        finished_at: attempts.last().and_then(|a| a.ended_at),
        last_error: attempts.last().and_then(|a| a.error.clone()),
        attempts,
        progress: None,
        result: None,
        after: Vec::new(),
    }
}

fn sample() -> RunReport {
    let t0 = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
    RunReport {
        queue: "q".into(),
        batch: BatchId(1),
        on_failure: OnFailure::Halt,
        halted: true,
        jobs: vec![
            job(
                t0,
                1,
                "a",
                100,
                JobState::Succeeded,
                vec![attempt(t0, 1, 0, 500, AttemptOutcome::Succeeded)],
            ),
            job(
                t0,
                2,
                "bad",
                100,
                JobState::Dead,
                vec![
                    attempt(t0, 1, 0, 100, AttemptOutcome::Failed),
                    attempt(t0, 2, 800, 1000, AttemptOutcome::Failed),
                ],
            ),
            job(t0, 3, "later", 200, JobState::Cancelled, vec![]),
        ],
    }
}

#[test]
fn timeline_draws_each_attempt_on_the_time_axis() {
    let text = sample().timeline(10);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("timeline: 0 → 1.000s, one column ≈ 100ms"),
        "{text}"
    );
    assert_eq!(lines[1], "stage 100 a     |#####     |");
    assert_eq!(lines[2], "stage 100 bad   |x       xx| dead");
    assert_eq!(lines[3], "stage 200 later |          | cancelled");
}

#[test]
fn table_has_a_row_per_job_with_offsets_and_outcomes() {
    let table = sample().table();
    assert!(table.contains("succeeded (exit 0)"), "{table}");
    assert!(table.contains("dead: exit status 3"), "{table}");
    assert!(table.contains("cancelled"), "{table}");
    // Job "bad": two attempts of two, from 0 s to 1 s.
    let bad = table.lines().find(|l| l.contains(" bad ")).unwrap();
    assert!(
        bad.contains("2/2") && bad.contains("0.000s") && bad.contains("1.000s"),
        "{bad}"
    );
}

#[test]
fn failures_show_the_last_error_of_dead_jobs() {
    let text = sample().failures();
    assert!(
        text.starts_with("── job 2 \"bad\" (stage 100) is dead after 2 attempt(s); last error:\n"),
        "{text}"
    );
    assert!(
        text.contains("    exit status 3\n    --- output ---\n    boom\n"),
        "{text}"
    );
    assert!(!text.contains("later"), "{text}");
}

#[test]
fn totals_count_outcomes() {
    let r = sample();
    assert_eq!(
        r.totals(),
        "3 jobs in 1.000s: 1 succeeded, 1 dead, 1 cancelled (on_failure = \"halt\": the rest of the batch was cancelled)"
    );
    assert_eq!(r.unsuccessful(), 2);
}
