//! `relayq pause`, `relayq resume`, `relayq limit N|none [--key K | --each-key]`,
//! `relayq limit --rate N/1s|none [--burst B] [--key K | --each-key]`: a queue's
//! settings (SPEC C6, K1, K8, K12).

use relayq_core::Backend;

use crate::{
    args::QueueArg,
    backend::{self, Use},
    exit,
};

/// Arguments of `relayq pause` and `relayq resume`.
#[derive(Debug, clap::Args)]
pub struct QueueOnly {
    #[command(flatten)]
    pub queue: QueueArg,
    /// The queue is not in use yet: set it before its first job is enqueued (without
    /// this, a name no job or setting uses is refused as a likely typo).
    #[arg(long)]
    pub new: bool,
}

/// Arguments of `relayq limit`.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// The most jobs of the queue that may run at once across all workers (1 or
    /// more), or `none` to lift the limit. May be left out with `--rate`.
    #[arg(value_parser = max_running, required_unless_present = "rate")]
    pub max: Option<Limit>,
    #[command(flatten)]
    pub queue: QueueArg,
    /// Limit the jobs of this limit key instead of the whole queue: at most that many
    /// with the key run at once (SPEC K).
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Limit every limit key that has no limit of its own.
    #[arg(long, conflicts_with = "key")]
    pub each_key: bool,
    /// At most this many jobs of the queue start per interval, across all workers:
    /// `N/1s`, `N/500ms`, `N/1m`, `N/1h`, `N/1d`; `none` lifts it (SPEC K8). With
    /// `--key` or `--each-key`, of that limit key, or of each key without a rate of
    /// its own, each key on its own allowance (SPEC K12).
    #[arg(long, value_name = "N/INTERVAL", value_parser = rate)]
    pub rate: Option<RateArg>,
    /// How many of the rate's starts may come at once (1 to N; default 1 % of N, at
    /// least 1). Under a backlog N - burst + 1 start per interval, evenly spaced.
    #[arg(long, requires = "rate")]
    pub burst: Option<u32>,
    /// The queue is not in use yet (see `relayq pause --help`).
    #[arg(long)]
    pub new: bool,
}

/// A limit, or none.
#[derive(Debug, Clone, Copy)]
pub struct Limit(pub Option<u32>);

/// A rate, or none.
#[derive(Debug, Clone, Copy)]
pub struct RateArg(pub Option<relayq_core::Rate>);

fn rate(text: &str) -> Result<RateArg, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(RateArg(None));
    }
    text.parse()
        .map(|r| RateArg(Some(r)))
        .map_err(|e: relayq_core::Error| e.to_string())
}

fn max_running(text: &str) -> Result<Limit, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    match text.parse::<u32>() {
        Ok(0) => Err("0 would stop every claim: use `relayq pause` instead".to_owned()),
        Ok(n) => Ok(Limit(Some(n))),
        Err(_) => Err(format!("{text:?} is not a number of jobs or `none`")),
    }
}

/// Pauses the queue: workers claim nothing more from it until `resume`; running jobs
/// go on.
///
/// # Errors
/// No database, a backend failure.
pub async fn pause(db: &str, args: QueueOnly) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    in_use(backend.as_ref(), &args.queue.queue, args.new).await?;
    backend.pause(&args.queue.queue).await?;
    outln!(
        "queue {:?} is paused: workers claim nothing from it until `relayq resume`; running jobs go on",
        args.queue.queue
    );
    Ok(exit::OK)
}

/// Lets workers claim from the queue again.
///
/// # Errors
/// No database, a backend failure.
pub async fn resume(db: &str, args: QueueOnly) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    in_use(backend.as_ref(), &args.queue.queue, args.new).await?;
    backend.resume(&args.queue.queue).await?;
    outln!("queue {:?} is running", args.queue.queue);
    Ok(exit::OK)
}

/// Sets or lifts the queue's limit of running jobs.
///
/// # Errors
/// No database, a bad limit, a backend failure.
pub async fn limit(db: &str, args: LimitArgs) -> anyhow::Result<u8> {
    let backend = backend::open(db, Use::Existing).await?;
    in_use(backend.as_ref(), &args.queue.queue, args.new).await?;
    let q = &args.queue.queue;
    if let Some(RateArg(rate)) = args.rate {
        let rate = match (rate, args.burst) {
            (Some(r), Some(burst)) => Some(r.with_burst(burst)),
            (None, Some(_)) => {
                return Err(crate::exit::usage("--burst needs a rate, not `none`"));
            }
            (r, None) => r,
        };
        if let Some(r) = &rate {
            relayq_core::validate::rate(r)
                .map_err(|e| crate::exit::usage(format!("--rate/--burst: {e}")))?;
        }
        if args.key.is_some() || args.each_key {
            backend.set_key_rate(q, args.key.as_deref(), rate).await?;
            let which = which_key(args.key.as_deref(), "a rate");
            match rate {
                Some(r) => {
                    outln!("queue {q:?}: at most {r} job starts of {which}, across all workers");
                }
                None => outln!("queue {q:?}: no rate limit for {which}"),
            }
        } else {
            let update = relayq_core::QueueUpdate::default().rate(rate);
            backend.update_queue(q, update).await?;
            match rate {
                Some(r) => outln!("queue {q:?}: at most {r} job starts, across all workers"),
                None => outln!("queue {q:?}: no rate limit"),
            }
        }
        if args.max.is_none() {
            return Ok(exit::OK);
        }
    }
    let Some(Limit(max)) = args.max else {
        return Ok(exit::OK);
    };
    if args.key.is_some() || args.each_key {
        backend.set_key_limit(q, args.key.as_deref(), max).await?;
        let which = which_key(args.key.as_deref(), "a limit");
        match max {
            Some(n) => outln!("queue {q:?}: at most {n} job(s) of {which} run at once"),
            None => outln!("queue {q:?}: no limit for {which}"),
        }
        return Ok(exit::OK);
    }
    backend.set_max_running(q, max).await?;
    match max {
        Some(n) => outln!(
            "queue {:?}: at most {n} job(s) run at once, across all workers",
            args.queue.queue
        ),
        None => outln!("queue {:?}: no limit of running jobs", args.queue.queue),
    }
    Ok(exit::OK)
}

/// The key a setting is for, in words: `key`, or each key without `what` of its own.
fn which_key(key: Option<&str>, what: &str) -> String {
    key.map_or_else(
        || format!("each limit key without {what} of its own"),
        |k| format!("limit key {k:?}"),
    )
}

/// Refuses a queue that no job or setting uses, unless the caller says it is `new`: a
/// setting stored under a mistyped name would create a queue and change nothing.
async fn in_use(backend: &dyn Backend, queue: &str, new: bool) -> anyhow::Result<()> {
    if new {
        return Ok(());
    }
    let queues = backend.queues().await?;
    if queues.iter().any(|q| q == queue) {
        return Ok(());
    }
    let known = if queues.is_empty() {
        "none is in use yet".to_owned()
    } else {
        // The names closest to the one given: the longest shared start first.
        let shared = |q: &str| {
            q.bytes()
                .zip(queue.bytes())
                .take_while(|(a, b)| a == b)
                .count()
        };
        let mut close: Vec<&str> = queues.iter().map(String::as_str).collect();
        close.sort_by_key(|q| std::cmp::Reverse(shared(q)));
        close.truncate(5);
        format!("{} in use, the closest: {}", queues.len(), close.join(", "))
    };
    Err(crate::exit::usage(format!(
        "no queue {queue:?} ({known}); pass --new to set it before its first job"
    )))
}
