//! The check: the ledger (what ran) against the database (what it says happened) and the
//! plan (what should have happened). Pure: every input is plain data, so a hand-made
//! ledger can be checked too (`tests/checker.rs`).

use std::collections::{BTreeMap, BTreeSet};

use relayq::{AttemptOutcome, JobId, JobInfo, JobState, QueueStats};

use crate::{
    ledger::{Ledger, Run},
    plan::{Mode, Plan},
};

/// What the run saw besides the ledger.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Each planned job's id, from its enqueue (`None`: the enqueue failed).
    pub ids: Vec<Option<JobId>>,
    /// Jobs enqueued while the workers ran that their batch refused: it had halted
    /// after a dead job (SPEC B6).
    pub refused: BTreeSet<usize>,
    /// For each deduplicated job (by plan index), what the second enqueue with the
    /// same key returned: its id and its `deduplicated` flag.
    pub dedupe: BTreeMap<usize, (JobId, bool)>,
    /// For each cancel made (by plan index): `Some(true)` cancelled, `Some(false)`
    /// already finished, `None` the call failed (either may have happened).
    pub cancels: BTreeMap<usize, Option<bool>>,
    /// Each planned job as the database has it at the end (`None`: not found).
    pub jobs: Vec<Option<JobInfo>>,
    /// The queue's counts at the end.
    pub stats: QueueStats,
}

/// One promise checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Its short name, for the table.
    pub name: &'static str,
    /// How many things it looked at (jobs, runs, pairs...).
    pub checked: usize,
    /// What broke it, one line each.
    pub violations: Vec<String>,
    /// What it let pass under a documented exception, one line each (an attempt that
    /// repeats after the server lost its claim in a crash).
    pub excused: Vec<String>,
}

/// Every check of one run, with figures.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The checks, in table order.
    pub checks: Vec<Check>,
    /// Figures: name and value.
    pub figures: Vec<(String, String)>,
}

impl Report {
    /// The number of violations over all checks.
    #[must_use]
    pub fn violations(&self) -> usize {
        self.checks.iter().map(|c| c.violations.len()).sum()
    }

    /// The check named `name`.
    ///
    /// # Panics
    /// When there is none.
    #[must_use]
    pub fn check(&self, name: &str) -> &Check {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check named {name:?}"))
    }
}

/// Names of the checks, as the table shows them.
pub mod names {
    /// Every enqueued job is in the database; a second enqueue with a held dedupe key
    /// returned the first job.
    pub const LOST: &str = "no job lost";
    /// Every job finished by the end.
    pub const STUCK: &str = "no job stuck";
    /// Each job ended in the state its kind promises.
    pub const STATES: &str = "final states";
    /// The queue's counts per state equal the jobs' states.
    pub const COUNTS: &str = "counts per state";
    /// At most one succeeded attempt per job, the last one; nothing ran after a job
    /// finished.
    pub const ONCE: &str = "completion accepted once";
    /// A succeeded job's command ran to exit 0 at least once.
    pub const RAN: &str = "succeeded jobs ran";
    /// Two attempts of one job never ran at once.
    pub const ATTEMPTS: &str = "attempts never overlap";
    /// Two jobs of one group never ran at once.
    pub const GROUP_OVERLAP: &str = "group: no overlap";
    /// A group's jobs started in order, each after the earlier ones finished.
    pub const GROUP_ORDER: &str = "group: in order";
    /// No job of a stage started before every job of the lower stages ended.
    pub const BARRIER: &str = "stage barrier";
    /// No job started before the jobs it runs after succeeded (SPEC D2).
    pub const AFTER: &str = "after: parents first";
    /// No delayed job started before its delay.
    pub const DELAY: &str = "delays kept";
    /// Every attempt of a finished job is closed in the execution log.
    pub const LOG: &str = "attempt log closed";
    /// Every ledger line could be read.
    pub const LEDGER: &str = "ledger readable";
}

fn micros(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_micros()
}

/// Whether job `i` is in a `Halt` batch with an always-failing job at its stage or a
/// lower one: the batch may have halted before `i` was enqueued, and refuse it.
fn halts_before(plan: &Plan, i: usize) -> bool {
    let Some((b, s)) = plan.jobs[i].batch else {
        return false;
    };
    plan.batches[b].halt
        && plan.jobs.iter().any(|o| {
            o.mode == Mode::Fail && matches!(o.batch, Some((ob, os)) if ob == b && os <= s)
        })
}

/// The states job `i` may end in.
#[must_use]
pub fn allowed_states(plan: &Plan, obs: &Observed, i: usize) -> Vec<JobState> {
    let job = &plan.jobs[i];
    if let Some(c) = obs.cancels.get(&i) {
        return match c {
            Some(true) => vec![JobState::Cancelled],
            Some(false) => vec![JobState::Succeeded],
            None => vec![JobState::Succeeded, JobState::Cancelled],
        };
    }
    if job.mode == Mode::Fail {
        return vec![JobState::Dead];
    }
    // SPEC D4: after a job that dies, directly or down the graph, it is cancelled.
    if plan.after_a_failure(i) {
        return vec![JobState::Cancelled];
    }
    if let Some((b, s)) = job.batch
        && plan.batches[b].halt
    {
        let failing_at = |cmp: fn(i32, i32) -> bool| {
            plan.jobs.iter().any(|o| {
                o.mode == Mode::Fail && matches!(o.batch, Some((ob, os)) if ob == b && cmp(os, s))
            })
        };
        if failing_at(|os, s| os < s) {
            return vec![JobState::Cancelled];
        }
        // SPEC B6: a job of the failing job's own stage is cancelled, running or not,
        // unless it finished first.
        if failing_at(|os, s| os == s) {
            return vec![JobState::Succeeded, JobState::Cancelled];
        }
    }
    vec![JobState::Succeeded]
}

/// What a backend's own documentation allows, which the check then lists as excused
/// instead of as violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allowances {
    /// A server crash may lose acknowledged claims (PostgreSQL commits claims
    /// asynchronously): overlaps involving a job whose ledger shows more runs than the
    /// database logged attempts are excused.
    pub lost_claims: bool,
    /// The database's times are transaction starts (PostgreSQL's `now()`): a claim
    /// transaction that began before an earlier job's settle began, but claimed after
    /// it committed, is logged as starting before that job finished. Such an order
    /// in the database's times is excused when the ledger shows the true order.
    pub tx_start_times: bool,
}

/// Checks one run.
#[must_use]
#[allow(
    clippy::too_many_lines,
    reason = "one check after the other, in table order"
)]
pub fn check(plan: &Plan, obs: &Observed, ledger: &Ledger, allow: Allowances) -> Report {
    let excuse_lost_claims = allow.lost_claims;
    let n = plan.jobs.len();
    let info = |i: usize| obs.jobs.get(i).and_then(Option::as_ref);
    let runs = |i: usize| ledger.runs_of(&plan.jobs[i].key);
    let mut report = Report::default();

    // Jobs whose ledger shows more runs than the database logged attempts: a claim the
    // server acknowledged and then forgot (a crash before its commit reached disk).
    let forgot: BTreeSet<usize> = (0..n)
        .filter(|&i| info(i).is_some_and(|j| runs(i).len() > j.attempt_log.len()))
        .collect();
    let forgotten_runs: usize = forgot
        .iter()
        .map(|&i| runs(i).len() - info(i).map_or(0, |j| j.attempt_log.len()))
        .sum();
    let excused = |keys: &[usize]| excuse_lost_claims && keys.iter().any(|k| forgot.contains(k));
    // Whether every run of `later` started after every run of `earlier` ended.
    let ledger_in_order = |earlier: usize, later: usize| {
        let last_end = runs(earlier).iter().filter_map(|r| r.end_us).max();
        let cut_short = runs(earlier).iter().any(|r| r.end_us.is_none());
        !cut_short
            && runs(later)
                .iter()
                .all(|r| last_end.is_none_or(|e| r.start_us >= e))
    };
    let key_index: BTreeMap<&str, usize> = plan
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (j.key.as_str(), i))
        .collect();

    // Lost.
    let mut lost = Check::new(names::LOST, n);
    for i in 0..n {
        let key = &plan.jobs[i].key;
        match (obs.ids.get(i).copied().flatten(), info(i)) {
            (None, _) if obs.refused.contains(&i) && !halts_before(plan, i) => {
                lost.violations.push(format!(
                    "{key}: refused as if its batch had halted, and no job before it fails"
                ));
            }
            (None, _) if obs.refused.contains(&i) => {}
            (None, _) => lost.violations.push(format!("{key}: its enqueue failed")),
            (Some(id), None) => lost
                .violations
                .push(format!("{key} (job {id}): not in the database")),
            _ => {}
        }
    }
    for (&i, &(id, dedup)) in &obs.dedupe {
        let first = obs.ids.get(i).copied().flatten();
        if first != Some(id) || !dedup {
            lost.violations.push(format!(
                "{}: second enqueue with its dedupe key returned job {id} (deduplicated: {dedup}), not job {first:?}",
                plan.jobs[i].key
            ));
        }
    }
    report.checks.push(lost);

    // Stuck, final states, counts.
    let mut stuck = Check::new(names::STUCK, n);
    let mut states = Check::new(names::STATES, n);
    let mut by_state: BTreeMap<JobState, u64> = BTreeMap::new();
    for i in 0..n {
        let Some(j) = info(i) else { continue };
        *by_state.entry(j.state).or_default() += 1;
        let key = &plan.jobs[i].key;
        if !j.state.is_finished() {
            stuck
                .violations
                .push(format!("{key} (job {}): {} at the end", j.id, j.state));
        }
        let allowed = allowed_states(plan, obs, i);
        if !allowed.contains(&j.state) {
            states.violations.push(format!(
                "{key} (job {}): {}, expected {} ({} attempts, last error {:?})",
                j.id,
                j.state,
                allowed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" or "),
                j.attempts,
                j.last_error
            ));
        }
    }
    report.checks.push(stuck);
    report.checks.push(states);
    let mut counts = Check::new(names::COUNTS, JobState::ALL.len());
    for s in JobState::ALL {
        let (queue, jobs) = (
            obs.stats.count(s),
            by_state.get(&s).copied().unwrap_or_default(),
        );
        if queue != jobs {
            counts.violations.push(format!(
                "{s}: queue_stats says {queue}, the jobs read one by one {jobs}"
            ));
        }
    }
    report.checks.push(counts);

    // Completion accepted once; nothing ran after a job finished.
    let mut once = Check::new(names::ONCE, n);
    let mut ran = Check::new(names::RAN, 0);
    let mut log = Check::new(names::LOG, 0);
    for i in 0..n {
        let Some(j) = info(i) else { continue };
        let key = &plan.jobs[i].key;
        let succeeded: Vec<u32> = j
            .attempt_log
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Succeeded)
            .map(|a| a.attempt)
            .collect();
        if succeeded.len() > 1 {
            once.violations.push(format!(
                "{key} (job {}): attempts {succeeded:?} all succeeded",
                j.id
            ));
        }
        if let (Some(first), Some(last)) = (succeeded.first(), j.attempt_log.last())
            && last.outcome != AttemptOutcome::Succeeded
        {
            once.violations.push(format!(
                "{key} (job {}): attempt {} ({}) logged after succeeded attempt {first}",
                j.id, last.attempt, last.outcome
            ));
        }
        if matches!(j.state, JobState::Succeeded | JobState::Dead)
            && let Some(fin) = j.finished_at
            && let Some(late) = runs(i).iter().find(|r| r.start_us > micros(fin))
        {
            once.violations.push(format!(
                "{key} (job {}): a run (pid {}) started {} µs after the job finished ({})",
                j.id,
                late.pid,
                late.start_us - micros(fin),
                j.state
            ));
        }
        if j.state == JobState::Succeeded {
            ran.checked += 1;
            if !runs(i).iter().any(|r| r.rc == Some(0)) {
                ran.violations.push(format!(
                    "{key} (job {}): succeeded, but no run of its command exited 0 ({} runs)",
                    j.id,
                    runs(i).len()
                ));
            }
        }
        if j.state.is_finished() {
            log.checked += j.attempt_log.len();
            for a in &j.attempt_log {
                if a.outcome == AttemptOutcome::Running || a.ended_at.is_none() {
                    log.violations.push(format!(
                        "{key} (job {}): attempt {} still {} in the log of a {} job",
                        j.id, a.attempt, a.outcome, j.state
                    ));
                }
            }
        }
    }
    report.checks.push(once);
    report.checks.push(ran);

    // Attempts of one job never overlap.
    let mut attempts = Check::new(names::ATTEMPTS, 0);
    for i in 0..n {
        let r = runs(i);
        attempts.checked += r.len();
        for w in r.windows(2) {
            if let Some(end) = w[0].end_us
                && w[1].start_us < end
            {
                let line = format!(
                    "{}: run of pid {} started {} µs before the run of pid {} ended",
                    plan.jobs[i].key,
                    w[1].pid,
                    end - w[1].start_us,
                    w[0].pid
                );
                attempts.push(line, excused(&[i]));
            }
        }
    }
    for a in ledger.alarms.iter().filter(|a| a.what == "job") {
        let i = key_index.get(a.key.as_str()).copied();
        let line = format!("{}: started while another run of it held its lock", a.key);
        attempts.push(line, i.is_some_and(|i| excused(&[i])));
    }
    report.checks.push(attempts);

    // Groups.
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, j) in plan.jobs.iter().enumerate() {
        if let Some(g) = &j.group {
            groups.entry(g).or_default().push(i);
        }
    }
    let mut overlap = Check::new(names::GROUP_OVERLAP, 0);
    let mut order = Check::new(names::GROUP_ORDER, 0);
    for (g, members) in &groups {
        // Every run of the group, with its job.
        let mut all: Vec<(usize, &Run)> = members
            .iter()
            .flat_map(|&i| runs(i).iter().map(move |r| (i, r)))
            .collect();
        all.sort_by_key(|(_, r)| r.start_us);
        overlap.checked += all.len();
        for (x, (i, a)) in all.iter().enumerate() {
            let Some(end) = a.end_us else { continue };
            for (k, b) in all[x + 1..].iter().take_while(|(_, b)| b.start_us < end) {
                if k != i {
                    let line = format!(
                        "group {g}: {} (pid {}) started while {} (pid {}) ran",
                        plan.jobs[*k].key, b.pid, plan.jobs[*i].key, a.pid
                    );
                    overlap.push(line, excused(&[*i, *k]));
                }
            }
        }
        // In order: job m's first start after every earlier job's last end (ledger) and
        // its first claim after every earlier job finished (database): the claim, not
        // the logged start, which a wait in the worker's buffer moves later.
        let mut ids: Vec<(JobId, usize)> = members
            .iter()
            .filter_map(|&i| obs.ids.get(i).copied().flatten().map(|id| (id, i)))
            .collect();
        ids.sort();
        let mut latest_end: Option<(i64, usize)> = None;
        let mut latest_finish: Option<(i64, usize)> = None;
        for &(_, m) in &ids {
            order.checked += 1;
            if let Some(first) = runs(m).first()
                && let Some((end, by)) = latest_end
                && first.start_us < end
            {
                let line = format!(
                    "group {g}: {} started {} µs before earlier {} ended (ledger)",
                    plan.jobs[m].key,
                    end - first.start_us,
                    plan.jobs[by].key
                );
                order.push(line, excused(&[m, by]));
            }
            if let Some(j) = info(m)
                && let Some(first) = j.attempt_log.first()
                && let Some((fin, by)) = latest_finish
                && micros(first.claimed()) < fin
            {
                let line = format!(
                    "group {g}: {} (job {}) claimed {} µs before earlier {} finished (database)",
                    plan.jobs[m].key,
                    j.id,
                    fin - micros(first.claimed()),
                    plan.jobs[by].key
                );
                let tx = allow.tx_start_times && ledger_in_order(by, m);
                order.push(line, tx || excused(&[m, by]));
            }
            for r in runs(m) {
                if let Some(e) = r.end_us
                    && latest_end.is_none_or(|(l, _)| e > l)
                {
                    latest_end = Some((e, m));
                }
            }
            if let Some(fin) = info(m).and_then(|j| j.finished_at)
                && latest_finish.is_none_or(|(l, _)| micros(fin) > l)
            {
                latest_finish = Some((micros(fin), m));
            }
        }
    }
    for a in ledger
        .alarms
        .iter()
        .filter(|a| a.what.starts_with("group:"))
    {
        let i = key_index.get(a.key.as_str()).copied();
        let line = format!(
            "{}: started while another job of {} held the group's lock",
            a.key, a.what
        );
        overlap.push(line, i.is_some_and(|i| excused(&[i])));
    }
    report.checks.push(overlap);
    report.checks.push(order);
    report
        .checks
        .extend(crate::keys::check(plan, obs, ledger, &excused));

    // Stage barriers.
    let mut barrier = Check::new(names::BARRIER, 0);
    for (b, batch) in plan.batches.iter().enumerate() {
        let in_stage = |s: i32| -> Vec<usize> {
            (0..n)
                .filter(|&i| plan.jobs[i].batch == Some((b, s)))
                .collect()
        };
        for (x, &s) in batch.stages.iter().enumerate().skip(1) {
            let lower: Vec<usize> = batch.stages[..x]
                .iter()
                .flat_map(|&l| in_stage(l))
                .collect();
            let upper = in_stage(s);
            barrier.checked += upper.len();
            let last_end = lower
                .iter()
                .flat_map(|&i| runs(i).iter().filter_map(move |r| r.end_us.map(|e| (e, i))))
                .max();
            let last_finish = lower
                .iter()
                .filter_map(|&i| info(i).and_then(|j| j.finished_at).map(|f| (micros(f), i)))
                .max();
            for &u in &upper {
                if let (Some(first), Some((end, by))) = (runs(u).first(), last_end)
                    && first.start_us < end
                {
                    let line = format!(
                        "batch {b}: {} of stage {s} started {} µs before {} of a lower stage ended (ledger)",
                        plan.jobs[u].key,
                        end - first.start_us,
                        plan.jobs[by].key
                    );
                    barrier.push(line, excused(&[u, by]));
                }
                if let Some(j) = info(u)
                    && let Some(first) = j.attempt_log.first()
                    && let Some((fin, by)) = last_finish
                    && micros(first.claimed()) < fin
                {
                    let line = format!(
                        "batch {b}: {} (job {}) of stage {s} claimed {} µs before {} of a lower stage finished (database)",
                        plan.jobs[u].key,
                        j.id,
                        fin - micros(first.claimed()),
                        plan.jobs[by].key
                    );
                    let tx = allow.tx_start_times && ledger_in_order(by, u);
                    barrier.push(line, tx || excused(&[u, by]));
                }
            }
        }
    }
    for a in ledger.alarms.iter().filter(|a| a.what.starts_with("stage")) {
        let i = key_index.get(a.key.as_str()).copied();
        let line = format!("{}: started while a job of {} was alive", a.key, a.what);
        barrier.push(line, i.is_some_and(|i| excused(&[i])));
    }
    report.checks.push(barrier);

    // Dependencies (SPEC D2): a job ran only after each job it runs after succeeded,
    // its first run after their last (ledger) and its first claim after they finished
    // (database); and it ran only if they all succeeded.
    let mut after = Check::new(names::AFTER, 0);
    for (u, job) in plan.jobs.iter().enumerate() {
        for &p in &job.after {
            after.checked += 1;
            let (child, parent) = (&plan.jobs[u].key, &plan.jobs[p].key);
            let last_end = runs(p).iter().filter_map(|r| r.end_us).max();
            if let (Some(first), Some(end)) = (runs(u).first(), last_end)
                && first.start_us < end
            {
                let line = format!(
                    "{child} started {} µs before {parent}, which it runs after, ended (ledger)",
                    end - first.start_us
                );
                after.push(line, excused(&[u, p]));
            }
            if !runs(u).is_empty() && info(p).is_some_and(|j| j.state != JobState::Succeeded) {
                let state = info(p).map(|j| j.state);
                let line = format!("{child} ran, but {parent}, which it runs after, is {state:?}");
                after.push(line, excused(&[u, p]));
            }
            if let (Some(j), Some(fin)) = (info(u), info(p).and_then(|j| j.finished_at))
                && let Some(first) = j.attempt_log.first()
                && micros(first.claimed()) < micros(fin)
            {
                let line = format!(
                    "{child} (job {}) claimed {} µs before {parent}, which it runs after, finished (database)",
                    j.id,
                    micros(fin) - micros(first.claimed())
                );
                let tx = allow.tx_start_times && ledger_in_order(p, u);
                after.push(line, tx || excused(&[u, p]));
            }
        }
    }
    report.checks.push(after);

    // Delays.
    let mut delay = Check::new(names::DELAY, 0);
    for (i, job) in plan.jobs.iter().enumerate() {
        if job.delay_ms == 0 {
            continue;
        }
        let Some(j) = info(i) else { continue };
        let Some(first) = j.attempt_log.first() else {
            continue;
        };
        delay.checked += 1;
        let due = micros(j.created_at) + i64::try_from(job.delay_ms).unwrap_or(i64::MAX) * 1000;
        if micros(first.claimed()) < due {
            delay.violations.push(format!(
                "{} (job {}): claimed {} µs before its delay of {} ms passed",
                job.key,
                j.id,
                due - micros(first.claimed()),
                job.delay_ms
            ));
        }
    }
    report.checks.push(delay);
    report.checks.push(log);

    let mut readable = Check::new(names::LEDGER, ledger.runs.values().map(Vec::len).sum());
    readable.violations.extend(
        ledger
            .bad_lines
            .iter()
            .map(|l| format!("unreadable line {l:?}")),
    );
    report.checks.push(readable);

    // Figures.
    let total_runs: usize = ledger.runs.values().map(Vec::len).sum();
    let logged: usize = (0..n).filter_map(info).map(|j| j.attempt_log.len()).sum();
    let killed_runs: usize = ledger
        .runs
        .values()
        .flatten()
        .filter(|r| r.end_us.is_none())
        .count();
    let max_attempts = (0..n)
        .filter_map(info)
        .map(|j| j.attempts)
        .max()
        .unwrap_or(0);
    report.figures.push(("jobs".into(), n.to_string()));
    for s in JobState::ALL {
        let c = obs.stats.count(s);
        if c > 0 {
            report.figures.push((format!("jobs {s}"), c.to_string()));
        }
    }
    report
        .figures
        .push(("command runs (ledger)".into(), total_runs.to_string()));
    report.figures.push((
        "runs cut short (no end line)".into(),
        killed_runs.to_string(),
    ));
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for a in (0..n).filter_map(info).flat_map(|j| &j.attempt_log) {
        *outcomes.entry(a.outcome.as_str()).or_default() += 1;
    }
    let outcomes: Vec<String> = outcomes.iter().map(|(o, c)| format!("{o} {c}")).collect();
    report.figures.push((
        "attempts logged (database)".into(),
        format!("{logged}: {}", outcomes.join(", ")),
    ));
    report.figures.push((
        "runs the database forgot (lost claims)".into(),
        format!("{forgotten_runs} in {} jobs", forgot.len()),
    ));
    report
        .figures
        .push(("most attempts of one job".into(), max_attempts.to_string()));
    report
}

impl Check {
    pub(crate) fn new(name: &'static str, checked: usize) -> Self {
        Self {
            name,
            checked,
            violations: Vec::new(),
            excused: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, line: String, excused: bool) {
        if excused {
            self.excused.push(line);
        } else {
            self.violations.push(line);
        }
    }
}
