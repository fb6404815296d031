//! SPEC S — schedules: one enqueue per slot, with no leader.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use chrono::{DateTime, Datelike, NaiveDate, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Europe::Berlin;
use relayq_core::{
    Backend, CompleteExt, JobState, NewJob, OnFailure,
    schedule::{Fire, Fired, Missed, Schedule, ScheduleInfo, Timetable},
};

use super::support::{claim_exactly, expect_invalid, expect_not_found, total};
use crate::{Env, queue_name};

/// Every second.
const EVERY_SECOND: &str = "* * * * * *";
/// Once a year, far from any test's run: for schedules that must not fire by time.
const YEARLY: &str = "0 0 1 1 *";

/// Every hour: a case that starts just before the last hour has one slot due, and no
/// new one comes while it runs.
const HOURLY: &str = "0 * * * *";

/// A second before the last full hour.
fn last_hour_but_a_second() -> anyhow::Result<DateTime<Utc>> {
    let table = Timetable::new(HOURLY, "UTC")?;
    Ok(table.last_until(Utc::now()).context("an hour")? - TimeDelta::seconds(1))
}

fn job(queue: &str, text: &str) -> NewJob {
    NewJob::new(queue, text.as_bytes().to_vec())
}

async fn one(b: &dyn Backend, queue: &str, name: &str) -> anyhow::Result<ScheduleInfo> {
    b.schedules(queue)
        .await?
        .into_iter()
        .find(|s| s.name == name)
        .with_context(|| format!("schedule {name:?} is not listed"))
}

/// The slots fired in `ticks`, in order.
fn fired_slots(fired: &[(String, DateTime<Utc>, Fired)]) -> Vec<DateTime<Utc>> {
    let mut slots: Vec<_> = fired.iter().map(|(_, s, _)| *s).collect();
    slots.sort();
    slots
}

/// SPEC S1, S6: a schedule is stored and listed with its next slot; replacing it keeps
/// its mark and pause and raises its version; bad input names its field and stores
/// nothing.
pub async fn s1_schedules_are_stored_replaced_and_checked(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s1");
    let s = Schedule::new(&q, "nightly", "0 2 * * *")
        .time_zone("Europe/Berlin")
        .job(job(&q, "report").priority(-2).max_attempts(5));
    b.put_schedule(&s).await?;
    let first = one(b, &q, "nightly").await?;
    let def = first
        .definition
        .clone()
        .context("the definition reads back")?;
    ensure!(
        def.cron == "0 2 * * *" && def.time_zone == "Europe/Berlin" && def.jobs.len() == 1,
        "read back: {def:?}"
    );
    ensure!(
        def.jobs[0].priority == -2 && def.jobs[0].max_attempts == 5,
        "{def:?}"
    );
    let next = first.next_slot.context("a next slot")?;
    let local = next.with_timezone(&Berlin);
    ensure!(
        (local.hour(), local.minute()) == (2, 0) && next > Utc::now() - TimeDelta::seconds(5),
        "next slot {next} is not the next 02:00 in Berlin"
    );
    ensure!(!first.paused && first.last_slot.is_none(), "{first:?}");
    ensure!(
        b.queues().await?.contains(&q),
        "a queue with a schedule is in use (SPEC M4)"
    );

    b.pause_schedule(&q, "nightly", true).await?;
    b.put_schedule(&Schedule::new(&q, "nightly", "0 3 * * *").job(job(&q, "report v2")))
        .await?;
    let second = one(b, &q, "nightly").await?;
    ensure!(
        second.version > first.version && second.mark == first.mark && second.paused,
        "a replacement keeps mark and pause and raises the version: {first:?} then {second:?}"
    );
    ensure!(
        second
            .definition
            .as_ref()
            .is_some_and(|d| d.cron == "0 3 * * *"),
        "the definition was replaced: {second:?}"
    );

    let bad: Vec<(&str, Schedule)> = vec![
        (
            "cron",
            Schedule::new(&q, "bad", "61 * * * *").job(job(&q, "x")),
        ),
        (
            "cron",
            Schedule::new(&q, "bad", "not cron").job(job(&q, "x")),
        ),
        (
            "cron",
            Schedule::new(&q, "bad", "0 0 0 1 1 * 2001").job(job(&q, "x")),
        ),
        (
            "time_zone",
            Schedule::new(&q, "bad", YEARLY)
                .time_zone("Mars/Olympus")
                .job(job(&q, "x")),
        ),
        ("name", Schedule::new(&q, "", YEARLY).job(job(&q, "x"))),
        (
            "name",
            Schedule::new(&q, "n".repeat(129), YEARLY).job(job(&q, "x")),
        ),
        ("name", Schedule::new(&q, "a\nb", YEARLY).job(job(&q, "x"))),
        (
            "queue",
            Schedule::new("bad queue", "bad", YEARLY).job(job(&q, "x")),
        ),
        ("jobs", Schedule::new(&q, "bad", YEARLY)),
        (
            "stage",
            Schedule::new(&q, "bad", YEARLY).job(job(&q, "x").stage(1)),
        ),
        (
            "missed",
            Schedule::new(&q, "bad", YEARLY)
                .missed(Missed::All { within_secs: 0 })
                .job(job(&q, "x")),
        ),
        (
            "max_attempts",
            Schedule::new(&q, "bad", YEARLY).job(job(&q, "x").max_attempts(0)),
        ),
    ];
    for (field, s) in bad {
        expect_invalid(b.put_schedule(&s).await, field, "a bad schedule")?;
    }
    let names: Vec<String> = b.schedules(&q).await?.into_iter().map(|s| s.name).collect();
    ensure!(
        names == ["nightly"],
        "bad input stored something: {names:?}"
    );
    Ok(())
}

/// SPEC S2: two schedulers on two connections, racing over a per-second schedule with
/// missed slots to catch up, enqueue each slot exactly once. Each passes until the
/// missed slots are caught up (or 20 s), as a scheduler's loop does: a pass that meets
/// the other's lock ends early, so a fixed number of passes could leave slots for later
/// on a loaded machine.
pub async fn s2_two_schedulers_enqueue_each_slot_once(env: &Env) -> anyhow::Result<()> {
    let a = env.shared();
    let other = env.connect().await?;
    let q = queue_name("s2race");
    let start = Utc::now().with_nanosecond(0).expect("valid") - TimeDelta::seconds(8);
    let s = Schedule::new(&q, "tick", EVERY_SECOND)
        .missed(Missed::all_within(Duration::from_secs(60)))
        .starting(start)
        .job(job(&q, "tick"));
    a.put_schedule(&s).await?;
    let caught_up = start + TimeDelta::seconds(8);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let run = |b: std::sync::Arc<dyn Backend>, q: String| async move {
        let mut fired = Vec::new();
        for pass in 0.. {
            fired.extend(b.run_schedules(&q).await?.fired);
            let done = pass >= 4 && one(&*b, &q, "tick").await?.mark >= caught_up;
            if done || std::time::Instant::now() > deadline {
                break;
            }
        }
        anyhow::Ok(fired)
    };
    let (x, y) = tokio::join!(run(a.clone(), q.clone()), run(other, q.clone()));
    let mut fired = x?;
    fired.extend(y?);
    let slots = fired_slots(&fired);
    let mark = one(&*a, &q, "tick").await?.mark;
    let want: Vec<DateTime<Utc>> = (1..)
        .map(|i| start + TimeDelta::seconds(i))
        .take_while(|t| *t <= mark)
        .collect();
    ensure!(
        want.len() >= 8,
        "the missed slots were not caught up: mark {mark}"
    );
    ensure!(
        slots == want,
        "each slot once: fired {} slots, want {}; fired {slots:?}",
        slots.len(),
        want.len()
    );
    let jobs = total(&*a, &q).await?;
    ensure!(
        jobs == want.len() as u64,
        "{jobs} jobs stored for {} slots",
        want.len()
    );
    Ok(())
}

/// SPEC S2: a fire is judged in the backend: a slot at or before the mark, a version
/// replaced since, a paused or deleted schedule, a slot after the server's time: each
/// stores nothing and moves nothing.
pub async fn s2_fire_refuses_what_is_not_due(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s2fire");
    let start = Utc::now() - TimeDelta::seconds(30);
    b.put_schedule(
        &Schedule::new(&q, "s", EVERY_SECOND)
            .starting(start)
            .job(job(&q, "x")),
    )
    .await?;
    let info = one(b, &q, "s").await?;
    let fire = |slot: DateTime<Utc>, version: i64| Fire {
        queue: q.clone(),
        name: "s".to_owned(),
        version,
        slot: Some(slot),
        jobs: vec![job(&q, "x")],
        batch: None,
    };
    let v = info.version;
    let cases = [
        (fire(info.mark, v), Fired::Taken, "a slot at the mark"),
        (
            fire(info.mark - TimeDelta::seconds(1), v),
            Fired::Taken,
            "a slot before the mark",
        ),
        (
            fire(info.mark + TimeDelta::seconds(1), v + 1),
            Fired::Changed,
            "another version",
        ),
        (
            fire(Utc::now() + TimeDelta::hours(1), v),
            Fired::NotDue,
            "a slot in the future",
        ),
    ];
    for (f, want, what) in cases {
        let got = b.fire_unchecked(f).await?;
        ensure!(got == want, "{what}: {got:?}, want {want:?}");
    }
    b.pause_schedule(&q, "s", true).await?;
    let got = b
        .fire_unchecked(fire(info.mark + TimeDelta::seconds(1), v))
        .await?;
    ensure!(got == Fired::Paused, "paused: {got:?}");
    b.delete_schedule(&q, "s").await?;
    let got = b
        .fire_unchecked(fire(info.mark + TimeDelta::seconds(1), v))
        .await?;
    ensure!(got == Fired::Gone, "deleted: {got:?}");
    ensure!(total(b, &q).await? == 0, "a refused fire stored a job");
    Ok(())
}

/// The schedules' passes until nothing more is due, their fired slots together.
async fn run_until_quiet(
    b: &dyn Backend,
    q: &str,
) -> anyhow::Result<Vec<(String, DateTime<Utc>, Fired)>> {
    let mut fired = Vec::new();
    for _ in 0..20 {
        let tick = b.run_schedules(q).await?;
        if tick.fired.is_empty() {
            return Ok(fired);
        }
        fired.extend(tick.fired);
    }
    anyhow::bail!("schedules of {q} kept firing: {fired:?}")
}

/// SPEC S3: after a daily schedule missed three days, `latest` runs the last slot
/// once, `skip` runs none, `all` within two days runs the two slots within it.
pub async fn s3_missed_slots_follow_the_policy(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s3");
    let start = Utc::now() - TimeDelta::days(3) - TimeDelta::hours(1);
    let daily = "0 0 * * *";
    let window = TimeDelta::days(2);
    for (name, missed) in [
        ("latest", Missed::Latest),
        ("skip", Missed::Skip),
        ("all", Missed::all_within(window.to_std()?)),
    ] {
        b.put_schedule(
            &Schedule::new(&q, name, daily)
                .missed(missed)
                .starting(start)
                .job(job(&q, name)),
        )
        .await?;
    }
    let before = Utc::now();
    let fired = run_until_quiet(b, &q).await?;
    let after = Utc::now();
    let table = Timetable::new(daily, "UTC")?;
    let last = table.last_until(after).context("a last midnight")?;
    let by = |n: &str| -> Vec<DateTime<Utc>> {
        fired_slots(
            &fired
                .iter()
                .filter(|f| f.0 == n)
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    ensure!(
        by("latest") == [last],
        "latest: {:?}, want {last}",
        by("latest")
    );
    // A midnight found within a minute of its time is on time, not missed.
    let skip_want: Vec<_> = if before - last <= TimeDelta::seconds(60) {
        vec![last]
    } else {
        vec![]
    };
    ensure!(
        by("skip") == skip_want,
        "skip: {:?}, want {skip_want:?}",
        by("skip")
    );
    // Midnights are far from the window's edge two days back: the last two are in.
    let all = by("all");
    let in_window = [last - TimeDelta::days(1), last];
    ensure!(
        all == in_window,
        "all within two days: {all:?}, want {in_window:?}"
    );
    for name in ["latest", "skip", "all"] {
        let s = one(b, &q, name).await?;
        ensure!(
            s.mark == last,
            "{name}: every missed slot is handled, mark {} want {last}",
            s.mark
        );
    }
    ensure!(
        total(b, &q).await? == (1 + skip_want.len() + all.len()) as u64,
        "stored jobs do not match the fired slots"
    );
    Ok(())
}

/// The last day, before `now`, on which Berlin's offset changed in `month` (3: spring
/// forward, 10: fall back).
fn last_change(now: DateTime<Utc>, month: u32) -> NaiveDate {
    let mut day = now.date_naive();
    loop {
        day = day.pred_opt().expect("a day before");
        let noon =
            |d: NaiveDate| Berlin.from_utc_datetime(&d.and_hms_opt(12, 0, 0).expect("valid"));
        let (today, yesterday) = (noon(day), noon(day.pred_opt().expect("valid")));
        if day.month() == month && today.offset() != yesterday.offset() && day < now.date_naive() {
            return day;
        }
    }
}

/// SPEC S4: around Berlin's last clock changes, 02:30 runs once a day: on the spring
/// day at 03:00 (02:30 does not exist), on the autumn day once (02:30 happens twice);
/// under `latest`, the missed days run the change's day alone, once.
pub async fn s4_daylight_saving_changes_run_each_slot_once(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s4");
    let now = Utc::now();
    for (name, month) in [("spring", 3), ("autumn", 10)] {
        let day = last_change(now, month);
        // The two days before the change and the change's day: all in one month.
        let cron = format!(
            "0 30 2 {}-{} {} * {}",
            day.day() - 2,
            day.day(),
            day.month(),
            day.year()
        );
        let start = Utc.from_utc_datetime(
            &(day - TimeDelta::days(3))
                .and_hms_opt(0, 0, 0)
                .expect("valid"),
        );
        b.put_schedule(
            &Schedule::new(&q, name, cron.clone())
                .time_zone("Europe/Berlin")
                .missed(Missed::all_within(relayq_core::schedule::MAX_CATCH_UP))
                .starting(start)
                .job(job(&q, name)),
        )
        .await?;
        // The same missed slots under `latest`: only the change's day runs, once.
        b.put_schedule(
            &Schedule::new(&q, format!("{name}-latest"), cron)
                .time_zone("Europe/Berlin")
                .starting(start)
                .job(job(&q, name)),
        )
        .await?;
    }
    let fired = run_until_quiet(b, &q).await?;
    for (name, on_day) in [
        ("spring-latest", "03:00 CEST"),
        ("autumn-latest", "02:30 CEST"),
    ] {
        let local: Vec<String> = fired
            .iter()
            .filter(|f| f.0 == name)
            .map(|f| f.1.with_timezone(&Berlin).format("%H:%M %Z").to_string())
            .collect();
        ensure!(
            local == [on_day],
            "{name}: fired {local:?}, want [{on_day:?}]"
        );
    }
    for (name, month) in [("spring", 3), ("autumn", 10)] {
        let day = last_change(now, month);
        let slots: Vec<_> = fired_slots(
            &fired
                .iter()
                .filter(|f| f.0 == name)
                .cloned()
                .collect::<Vec<_>>(),
        );
        let local: Vec<String> = slots
            .iter()
            .map(|s| s.with_timezone(&Berlin).format("%d %H:%M %Z").to_string())
            .collect();
        let on_day = if month == 3 {
            "03:00 CEST"
        } else {
            "02:30 CEST"
        };
        let want: Vec<String> = [2, 1, 0]
            .iter()
            .map(|back| {
                let d = day - TimeDelta::days(*back);
                let zone = if (month == 3) == (*back > 0) {
                    "CET"
                } else {
                    "CEST"
                };
                if *back == 0 {
                    format!("{:02} {on_day}", d.day())
                } else {
                    format!("{:02} 02:30 {zone}", d.day())
                }
            })
            .collect();
        ensure!(local == want, "{name}: fired {local:?}, want {want:?}");
    }
    Ok(())
}

/// SPEC S5: a paused schedule fires nothing; resumed, it runs its missed slot by its
/// policy; deleted, nothing; pausing or running an unknown schedule is `NotFound`.
pub async fn s5_pause_resume_and_delete(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s5");
    let start = last_hour_but_a_second()?;
    b.put_schedule(
        &Schedule::new(&q, "s", HOURLY)
            .starting(start)
            .job(job(&q, "x")),
    )
    .await?;
    b.pause_schedule(&q, "s", true).await?;
    ensure!(
        one(b, &q, "s").await?.next_slot.is_none(),
        "a paused schedule has no next slot"
    );
    let tick = b.run_schedules(&q).await?;
    ensure!(
        tick.fired.is_empty(),
        "a paused schedule fired: {:?}",
        tick.fired
    );
    ensure!(total(b, &q).await? == 0, "a paused schedule stored a job");
    b.pause_schedule(&q, "s", false).await?;
    let fired = run_until_quiet(b, &q).await?;
    ensure!(
        fired.len() == 1,
        "resumed, `latest` runs one slot: {fired:?}"
    );
    let info = one(b, &q, "s").await?;
    let (_, made_job) = fired[0].2.made().context("made")?;
    ensure!(
        info.last_slot == Some(fired[0].1) && info.last_job == made_job && made_job.is_some(),
        "the list shows the last slot and its job: {info:?}"
    );
    ensure!(b.delete_schedule(&q, "s").await?, "delete finds it");
    ensure!(
        !b.delete_schedule(&q, "s").await?,
        "a second delete finds nothing"
    );
    ensure!(b.schedules(&q).await?.is_empty(), "deleted, not listed");
    let n = total(b, &q).await?;
    let tick = b.run_schedules(&q).await?;
    ensure!(
        tick.fired.is_empty() && total(b, &q).await? == n,
        "a deleted schedule fired"
    );
    expect_not_found(
        b.pause_schedule(&q, "nope", true).await,
        "pausing an unknown schedule",
    )?;
    expect_not_found(
        b.run_schedule_now(&q, "nope").await,
        "running an unknown schedule",
    )?;
    Ok(())
}

/// SPEC S5: "run now" enqueues one slot's jobs at once, even paused, and moves no mark.
pub async fn s5_run_now_is_an_extra_run(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s5now");
    b.put_schedule(
        &Schedule::new(&q, "s", YEARLY)
            .job(job(&q, "a"))
            .job(job(&q, "b")),
    )
    .await?;
    b.pause_schedule(&q, "s", true).await?;
    let before = one(b, &q, "s").await?;
    let fired = b.run_schedule_now(&q, "s").await?;
    let Fired::Made { batch: None, jobs } = &fired else {
        anyhow::bail!("run now: {fired:?}");
    };
    ensure!(
        jobs.len() == 2 && total(b, &q).await? == 2,
        "run now stored {jobs:?}"
    );
    let info = b.job(&q, jobs[0].id).await?;
    ensure!(
        info.payload == b"a" && info.enqueued_by.as_deref() == Some("schedule s"),
        "the job says which schedule made it: {info:?}"
    );
    let after = one(b, &q, "s").await?;
    ensure!(
        after.mark == before.mark && after.paused,
        "run now moved the mark or resumed: {after:?}"
    );
    Ok(())
}

/// SPEC S1, S2: a slot of a batch schedule makes one sealed batch, named after the
/// schedule, with every job at its stage, in the same atomic step.
pub async fn s1_a_batch_schedule_makes_a_sealed_staged_batch(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s1batch");
    let start = Utc::now() - TimeDelta::seconds(3);
    b.put_schedule(
        &Schedule::new(&q, "plan", EVERY_SECOND)
            .starting(start)
            .batch(OnFailure::Halt)
            .job(job(&q, "extract").stage(10))
            .job(job(&q, "load").stage(20)),
    )
    .await?;
    let tick = b.run_schedules(&q).await?;
    ensure!(tick.fired.len() == 1, "one slot (latest): {:?}", tick.fired);
    let Fired::Made {
        batch: Some(id),
        jobs,
    } = &tick.fired[0].2
    else {
        anyhow::bail!("a batch slot made no batch: {:?}", tick.fired[0].2);
    };
    let batch = relayq_core::Batch {
        queue: q.clone(),
        id: *id,
    };
    let p = b.batch_progress(&batch).await?;
    ensure!(p.sealed, "the slot's batch is sealed: {p:?}");
    ensure!(
        p.name.as_deref() == Some("plan"),
        "the slot's batch is named after its schedule: {:?}",
        p.name
    );
    let stages: Vec<i32> = p.stages.iter().map(|s| s.stage).collect();
    ensure!(
        stages == [10, 20] && jobs.len() == 2,
        "stages {stages:?}, jobs {jobs:?}"
    );
    claim_exactly(b, &q, &[jobs[0].id]).await?;
    ensure!(
        one(b, &q, "plan").await?.last_batch == Some(*id),
        "the list shows the batch the slot made"
    );
    Ok(())
}

/// SPEC S2: the mark, not the jobs, remembers a slot: pruning its finished job does
/// not make it fire again.
pub async fn s2_pruning_does_not_bring_a_slot_back(env: &Env) -> anyhow::Result<()> {
    let b = env.backend();
    let q = queue_name("s2prune");
    let start = last_hour_but_a_second()?;
    b.put_schedule(
        &Schedule::new(&q, "s", HOURLY)
            .starting(start)
            .job(job(&q, "x")),
    )
    .await?;
    let fired = run_until_quiet(b, &q).await?;
    ensure!(fired.len() == 1, "one slot: {fired:?}");
    let (_, made) = fired[0].2.made().context("made")?;
    let got = claim_exactly(b, &q, &[made.context("a job")?]).await?;
    b.complete(&got[0].lease).await?;
    let pruned = b.maintain(&q, Duration::ZERO).await?.pruned;
    ensure!(pruned == 1, "the finished job is pruned: {pruned}");
    let again = run_until_quiet(b, &q).await?;
    ensure!(again.is_empty(), "a pruned slot fired again: {again:?}");
    ensure!(
        b.queue_stats(&q).await?.count(JobState::Ready) == 0,
        "no new job"
    );
    Ok(())
}
