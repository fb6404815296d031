//! The seeded mix of jobs: plain, grouped, staged (Halt and Continue), delayed, failing
//! then succeeding, always failing, deduplicated and cancelled.

use std::fmt::Write as _;

/// What a job's command does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Exits 0.
    Ok,
    /// Exits 1 on its first attempt (it leaves a marker file), 0 afterwards.
    Flaky,
    /// Always exits 1: the job ends dead.
    Fail,
}

impl Mode {
    /// The word `job.sh` takes.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Flaky => "flaky",
            Self::Fail => "fail",
        }
    }
}

/// One planned job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    /// The key the ledger knows it by: `k<index>`.
    pub key: String,
    /// What its command does.
    pub mode: Mode,
    /// How long its command sleeps, in milliseconds (< 1000).
    pub sleep_ms: u32,
    /// Attempts it gets.
    pub max_attempts: u16,
    /// Its group, if any.
    pub group: Option<String>,
    /// Its batch (an index into [`Plan::batches`]) and stage.
    pub batch: Option<(usize, i32)>,
    /// Not before this long after its enqueue.
    pub delay_ms: u64,
    /// Enqueued with a dedupe key, and a second time with the same key (E3).
    pub dedupe: bool,
    /// Cancelled while the workers run (B7).
    pub cancel: bool,
    /// Its limit key (SPEC K): [`KEY_LIMITS`] gives each key's limit.
    pub limit_key: Option<&'static str>,
    /// The jobs of its batch it runs after (SPEC D), by plan index: earlier jobs of the
    /// same batch, at its stage or a lower one, from the half enqueued before the
    /// workers start (so their ids are known when it is enqueued).
    pub after: Vec<usize>,
}

/// The limit keys of the mix and their limits (SPEC K): a key of one (its jobs never
/// overlap) and a key of three.
pub const KEY_LIMITS: &[(&str, u32)] = &[("lk1", 1), ("lk3", 3)];

/// One planned batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBatch {
    /// `OnFailure::Halt` (else `Continue`).
    pub halt: bool,
    /// Its stages, ascending.
    pub stages: Vec<i32>,
}

/// The whole mix.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Every job, in enqueue order within its kind.
    pub jobs: Vec<PlannedJob>,
    /// Every batch.
    pub batches: Vec<PlannedBatch>,
}

/// Attempts of every job but the always-failing ones: enough that faults (each killed
/// or frozen worker costs the jobs it held one attempt) never exhaust them.
pub const MAX_ATTEMPTS: u16 = 25;
/// Attempts of an always-failing job.
pub const FAIL_ATTEMPTS: u16 = 2;

impl Plan {
    /// The mix for `jobs` jobs from `seed`: about 45% plain (a tenth of them delayed, a
    /// tenth failing once, a twentieth deduplicated, a thirtieth cancelled, one in a
    /// hundred always failing), 20% in groups of 20, 35% in sealed batches of three
    /// stages (half Halt, half Continue; every other batch has one always-failing job
    /// in its middle stage).
    #[must_use]
    pub fn generate(seed: u64, jobs: usize, max_delay_ms: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut plan = Plan::default();
        let jobs = jobs.max(30);
        let batch_jobs = jobs * 35 / 100;
        let group_jobs = jobs * 20 / 100;
        let plain_jobs = jobs - batch_jobs - group_jobs;
        let push = |plan: &mut Plan, rng: &mut fastrand::Rng, f: &dyn Fn(&mut PlannedJob)| {
            let mut job = PlannedJob {
                key: format!("k{}", plan.jobs.len()),
                mode: Mode::Ok,
                sleep_ms: rng.u32(10..=120),
                max_attempts: MAX_ATTEMPTS,
                group: None,
                batch: None,
                delay_ms: 0,
                dedupe: false,
                cancel: false,
                limit_key: None,
                after: Vec::new(),
            };
            f(&mut job);
            plan.jobs.push(job);
        };
        // Batches of about 60 jobs, three stages.
        let n_batches = (batch_jobs / 60).max(1);
        for b in 0..n_batches {
            let halt = b % 2 == 0;
            let stages = vec![100, 200, 300];
            let per_stage = (batch_jobs / n_batches / 3).max(2);
            let failing = b % 4 < 2; // batches 0, 1 (Halt, Continue), 4, 5, ...
            for &stage in &stages {
                for i in 0..per_stage {
                    let flaky = rng.u8(0..20) == 0;
                    let fail = failing && stage == 200 && i == per_stage / 2;
                    push(&mut plan, &mut rng, &|j| {
                        j.batch = Some((b, stage));
                        if fail {
                            j.mode = Mode::Fail;
                            j.max_attempts = FAIL_ATTEMPTS;
                        } else if flaky {
                            j.mode = Mode::Flaky;
                        }
                    });
                }
            }
            plan.batches.push(PlannedBatch { halt, stages });
        }
        // Groups of 20.
        let n_groups = (group_jobs / 20).max(1);
        for i in 0..group_jobs.max(2) {
            let flaky = rng.u8(0..10) == 0;
            let group = format!("g{}", i % n_groups);
            push(&mut plan, &mut rng, &|j| {
                j.group = Some(group.clone());
                if flaky {
                    j.mode = Mode::Flaky;
                }
            });
        }
        for _ in 0..plain_jobs {
            let roll = rng.u32(0..1000);
            let delay = rng.u64(500..=max_delay_ms.max(501));
            push(&mut plan, &mut rng, &|j| match roll {
                0..100 => j.delay_ms = delay,
                100..200 => j.mode = Mode::Flaky,
                200..250 => j.dedupe = true,
                250..283 => j.cancel = true,
                283..293 => {
                    j.mode = Mode::Fail;
                    j.max_attempts = FAIL_ATTEMPTS;
                }
                _ => {}
            });
        }
        // Limit keys on a tenth of the plain jobs (key of one) and a fifth (key of
        // three), and on a tenth of the grouped ones (key of three): by position, so the
        // rest of the mix stays as the seed makes it.
        for (i, job) in plan.jobs.iter_mut().enumerate() {
            job.limit_key = match (job.batch.is_some(), job.group.is_some(), i % 10) {
                (false, false, 3) => Some("lk1"),
                (false, false, 5 | 7) | (false, true, 1) => Some("lk3"),
                _ => None,
            };
        }
        plan.add_after(seed);
        plan
    }

    /// SPEC D: two in five batch jobs past the first of their batch run after one or
    /// two earlier jobs of it, from its first half (the half enqueued early, see
    /// `feed::split`). From a generator of its own, so the rest of the mix stays as
    /// the seed makes it. The first job of every batch has none, and a batch's jobs
    /// are pushed stage by stage, so a parent's stage is never above its child's.
    fn add_after(&mut self, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xa17e);
        for b in 0..self.batches.len() {
            let members: Vec<usize> = (0..self.jobs.len())
                .filter(|&i| self.jobs[i].batch.is_some_and(|(jb, _)| jb == b))
                .collect();
            let early = members.len() / 2;
            for (k, &i) in members.iter().enumerate().skip(1) {
                if rng.u8(0..5) >= 2 {
                    continue;
                }
                let pool = &members[..k.min(early)];
                if pool.is_empty() {
                    continue;
                }
                let mut after = vec![pool[rng.usize(0..pool.len())]];
                let other = pool[rng.usize(0..pool.len())];
                if rng.bool() && !after.contains(&other) {
                    after.push(other);
                }
                self.jobs[i].after = after;
            }
        }
    }

    /// The plan without dependencies, for a backend that does not keep them.
    #[must_use]
    pub fn without_after(mut self) -> Self {
        for job in &mut self.jobs {
            job.after.clear();
        }
        self
    }

    /// Whether job `i` runs after an always-failing job, directly or down the graph:
    /// then it is cancelled (SPEC D4, the default policy).
    #[must_use]
    pub fn after_a_failure(&self, i: usize) -> bool {
        let mut todo = self.jobs[i].after.clone();
        while let Some(p) = todo.pop() {
            if self.jobs[p].mode == Mode::Fail {
                return true;
            }
            todo.extend(self.jobs[p].after.iter().copied());
        }
        false
    }

    /// The plan without limit keys, for a backend that does not keep them.
    #[must_use]
    pub fn without_limit_keys(mut self) -> Self {
        for job in &mut self.jobs {
            job.limit_key = None;
        }
        self
    }

    /// The stages below `stage` in `batch`.
    #[must_use]
    pub fn lower_stages(&self, batch: usize, stage: i32) -> Vec<i32> {
        self.batches[batch]
            .stages
            .iter()
            .copied()
            .filter(|&s| s < stage)
            .collect()
    }

    /// The shell command of job `index`: `bash DIR/job.sh DIR KEY SLEEP MODE LOCKS...`.
    #[must_use]
    pub fn command(&self, dir: &str, index: usize) -> String {
        let job = &self.jobs[index];
        let mut cmd = format!(
            "bash {dir}/job.sh {dir} {} {} {}",
            job.key,
            job.sleep_ms,
            job.mode.word()
        );
        if let Some(g) = &job.group {
            let _ = write!(cmd, " g={g}");
        }
        if let Some((b, s)) = job.batch {
            let _ = write!(cmd, " s={b}-{s}");
            for lower in self.lower_stages(b, s) {
                let _ = write!(cmd, " p={b}-{lower}");
            }
        }
        cmd
    }
}

/// The script every job runs. It appends to `DIR/ledger` one line when its attempt
/// starts (`S KEY PID MICROS`) and one when it ends (`E KEY PID MICROS RC`), with
/// O_APPEND (`>>`), each line one `write`. It also holds `flock` locks while it runs:
/// its job's lock and its group's lock exclusively, its stage's lock shared, and it
/// tries each lower stage's lock exclusively once (probes take turns on a lock of their
/// own, so only a live job of that stage can make one fail). A lock another live attempt holds
/// is an `X KEY PID MICROS WHAT` alarm line: a second attempt of the job, a second job
/// of the group, or a job of a lower stage is alive now. The kernel drops a killed
/// process's locks, so this sees attempts that died without their `E` line.
pub const JOB_SCRIPT: &str = r#"# job.sh DIR KEY SLEEP_MS MODE [g=GROUP] [s=BATCH-STAGE] [p=BATCH-LOWERSTAGE]...
d=$1 k=$2 ms=$3 mode=$4
shift 4
L="$d/ledger"
alarm() { echo "X $k $$ ${EPOCHREALTIME//[!0-9]/} $1" >> "$L"; }
exec 9>>"$d/locks/job-$k"
flock -n 9 || alarm job
for a in "$@"; do
  case $a in
    g=*) exec 8>>"$d/locks/group-${a#g=}"; flock -n 8 || alarm "group:${a#g=}" ;;
    s=*) exec 7>>"$d/locks/stage-${a#s=}"; flock -s -w 5 7 || alarm "stage-lock:${a#s=}" ;;
    p=*) flock -w 5 "$d/locks/probe-${a#p=}" flock -n -x "$d/locks/stage-${a#p=}" true ||
           alarm "stage:${a#p=}" ;;
  esac
done
echo "S $k $$ ${EPOCHREALTIME//[!0-9]/}" >> "$L"
sleep "$(printf '0.%03d' "$ms")"
rc=0
case $mode in
  flaky) if [ ! -e "$d/marks/$k" ]; then : > "$d/marks/$k"; rc=1; fi ;;
  fail) rc=1 ;;
esac
echo "E $k $$ ${EPOCHREALTIME//[!0-9]/} $rc" >> "$L"
exit $rc
"#;
