//! "Why is this job not running?" (SPEC M6): every rule that holds a job back, each
//! naming what it waits for, read from the backend's own answers.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{Batch, BatchId, Inspect, JobId, JobInfo, JobState, OrderBarrier, Result, validate};

/// How many of the jobs filling `max_running` are named.
pub const HOLDERS_LISTED: usize = 10;

/// One rule holding a job back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hold {
    /// Its `run_at` lies ahead (SPEC E2).
    NotBefore(DateTime<Utc>),
    /// A failed attempt's backoff: it is tried again then (SPEC L2).
    Backoff {
        /// When it is tried again.
        until: DateTime<Utc>,
        /// Attempts made so far.
        attempts: u32,
        /// Attempts it gets.
        max_attempts: u16,
    },
    /// A lower stage of its batch is unfinished (SPEC B2).
    Stage {
        /// Its batch.
        batch: BatchId,
        /// Its own stage.
        stage: i32,
        /// The lowest stage with unfinished jobs.
        waiting_for: i32,
        /// Unfinished jobs in the stages below its own.
        unfinished: u64,
    },
    /// Jobs it runs after are unfinished (SPEC D2).
    After {
        /// Up to [`HOLDERS_LISTED`] of them, in id order.
        jobs: Vec<JobId>,
        /// Whether more are unfinished than those named.
        more: bool,
    },
    /// Another job of its group goes first (SPEC G1, G2): the one running or retrying
    /// in it, else one earlier in the group's order.
    Group {
        /// The group.
        group: String,
        /// The job running or retrying in the group, if one is
        /// ([`Inspect::group_holder`](crate::Inspect::group_holder)).
        holder: Option<JobId>,
    },
    /// Its queue is paused (SPEC C6).
    Paused,
    /// Its queue runs as many jobs as its `max_running` allows (SPEC C6).
    MaxRunning {
        /// The limit.
        max: u32,
        /// Jobs running now.
        running: u64,
        /// Up to [`HOLDERS_LISTED`] of them, oldest first, with their workers.
        holders: Vec<(JobId, String)>,
    },
    /// Its limit key runs as many jobs as its limit allows (SPEC K2).
    Key {
        /// The key.
        key: String,
        /// Its jobs running now.
        running: u64,
        /// Its limit.
        limit: u32,
    },
    /// Its queue's rate allows no start before `next` (SPEC K8, K11).
    Rate {
        /// The rate.
        rate: crate::Rate,
        /// When it allows the next start, on the server's clock.
        next: DateTime<Utc>,
    },
    /// Its limit key's rate allows no start before `next` (SPEC K12, K14).
    KeyRate {
        /// The key.
        key: String,
        /// The key's rate.
        rate: crate::Rate,
        /// When it allows the key's next start, on the server's clock.
        next: DateTime<Utc>,
    },
}

/// What [`InspectExt::why`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Why {
    /// It runs now.
    Running {
        /// The worker holding it.
        worker: String,
        /// Since when.
        since: DateTime<Utc>,
    },
    /// It finished, in this state.
    Finished(JobState),
    /// Nothing holds it: the next claim of its queue may take it.
    Claimable,
    /// These rules hold it, every one of them.
    Held(Vec<Hold>),
}

/// "Why is this job not running?", written once over [`Inspect`] and [`OrderBarrier`].
#[async_trait]
pub trait InspectExt: Inspect + OrderBarrier {
    /// Waits until job `id` of `queue` is finished, and returns it (SPEC D6).
    ///
    /// # Behavior
    /// - Returns the job once it is succeeded, dead or cancelled; at once when it is.
    /// - Re-checks on each finished-job event of its queue and at least every 100 ms;
    ///   [`Error::Timeout`](crate::Error::Timeout) when `timeout` passes first.
    /// - An unknown job is [`Error::NotFound`](crate::Error::NotFound).
    async fn wait_job(
        &self,
        queue: &str,
        id: JobId,
        timeout: std::time::Duration,
    ) -> Result<JobInfo> {
        validate::queue_name(queue)?;
        crate::wait_job_polling(self, queue, id, timeout).await
    }

    /// Every rule that holds job `id` of `queue` back, or that it runs, finished, or
    /// waits for nothing but a claim (SPEC M6).
    ///
    /// # Behavior
    /// - A job not yet due names its `run_at`; a retrying one its backoff's end; one
    ///   behind a lower stage the stage and how many jobs are unfinished below its own;
    ///   one behind its group the group and the job running in it (when one is); a
    ///   paused queue; a queue at its `max_running`, with the running count and the
    ///   oldest running jobs with their workers; a full limit key, with its running
    ///   count and limit; a queue whose rate allows no start now, with when it will
    ///   (SPEC M6, K7, K11); unfinished jobs it runs after, the first ten by id (SPEC
    ///   D2).
    /// - A running job names its worker; a finished one its state.
    /// - An unknown job is [`Error::NotFound`](crate::Error::NotFound).
    async fn why(&self, queue: &str, id: JobId) -> Result<Why> {
        validate::queue_name(queue)?;
        let job = self.job(queue, id).await?;
        if job.state.is_finished() {
            return Ok(Why::Finished(job.state));
        }
        if job.state == JobState::Running {
            let running = self.running(queue).await?;
            if let Some(r) = running.into_iter().find(|r| r.id == id) {
                return Ok(Why::Running {
                    worker: r.worker,
                    since: r.started_at,
                });
            }
        }
        let mut holds = Vec::new();
        match job.state {
            JobState::Scheduled => holds.push(Hold::NotBefore(job.run_at)),
            // `Inspect` gives no server time: a retry whose time this process's
            // clock has passed is reported claimable, as the backend will soon see it.
            JobState::Retrying if job.run_at > Utc::now() => holds.push(Hold::Backoff {
                until: job.run_at,
                attempts: job.attempts,
                max_attempts: job.max_attempts,
            }),
            _ => {}
        }
        if let Some(hold) = self.stage_hold(queue, &job).await? {
            holds.push(hold);
        }
        if job.state == JobState::Blocked {
            let mut unfinished = Vec::new();
            for parent in &job.after {
                // A job pruned away had finished.
                let finished = match self.job(queue, *parent).await {
                    Ok(p) => p.state.is_finished(),
                    Err(e) if e.kind() == crate::ErrorKind::NotFound => true,
                    Err(e) => return Err(e),
                };
                if !finished {
                    unfinished.push(*parent);
                    if unfinished.len() > HOLDERS_LISTED {
                        break;
                    }
                }
            }
            if !unfinished.is_empty() {
                let more = unfinished.len() > HOLDERS_LISTED;
                unfinished.truncate(HOLDERS_LISTED);
                holds.push(Hold::After {
                    jobs: unfinished,
                    more,
                });
            }
        }
        if job.state == JobState::Blocked
            && let Some(group) = &job.group
        {
            holds.push(Hold::Group {
                group: group.clone(),
                holder: self.group_holder(queue, group).await?,
            });
        }
        let stats = self.queue_stats(queue).await?;
        if stats.paused {
            holds.push(Hold::Paused);
        }
        let running = stats.count(JobState::Running);
        if let Some(max) = stats.max_running
            && running >= u64::from(max)
        {
            let mut now_running = self.running(queue).await?;
            now_running.sort_by_key(|r| r.started_at);
            let holders = now_running
                .into_iter()
                .take(HOLDERS_LISTED)
                .map(|r| (r.id, r.worker))
                .collect();
            holds.push(Hold::MaxRunning {
                max,
                running,
                holders,
            });
        }
        if let (Some(rate), Some(next)) = (stats.rate, stats.rate_next)
            && matches!(job.state, JobState::Ready | JobState::Retrying)
        {
            holds.push(Hold::Rate { rate, next });
        }
        if let Some(key) = &job.limit_key
            && matches!(job.state, JobState::Ready | JobState::Retrying)
        {
            let keys = self.key_limits(queue).await?;
            let used = keys.keys.iter().find(|k| &k.key == key);
            let running = used.map_or(0, |k| k.running);
            if let Some(limit) = keys.limit_of(key)
                && running >= u64::from(limit)
            {
                holds.push(Hold::Key {
                    key: key.clone(),
                    running,
                    limit,
                });
            }
            if let Some((rate, next)) = used.and_then(|k| k.rate.zip(k.rate_next)) {
                holds.push(Hold::KeyRate {
                    key: key.clone(),
                    rate,
                    next,
                });
            }
        }
        Ok(if holds.is_empty() {
            Why::Claimable
        } else {
            Why::Held(holds)
        })
    }

    /// The stage rule, for a job of a batch whose lower stages are unfinished.
    #[doc(hidden)]
    async fn stage_hold(&self, queue: &str, job: &JobInfo) -> Result<Option<Hold>> {
        let (Some(batch), Some(stage)) = (job.batch, job.stage) else {
            return Ok(None);
        };
        let progress = self
            .batch_progress(&Batch {
                queue: queue.to_owned(),
                id: batch,
            })
            .await?;
        let below: Vec<_> = progress
            .stages
            .iter()
            .filter(|s| s.stage < stage && s.pending + s.running > 0)
            .collect();
        Ok(below.first().map(|lowest| Hold::Stage {
            batch,
            stage,
            waiting_for: lowest.stage,
            unfinished: below.iter().map(|s| s.pending + s.running).sum(),
        }))
    }
}

impl<T: Inspect + OrderBarrier + ?Sized> InspectExt for T {}

impl Why {
    /// The answer in words, one line per reason (for the CLI and the dashboard).
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        match self {
            Self::Running { worker, since } => {
                vec![format!("running on {worker} since {}", stamp(*since))]
            }
            Self::Finished(state) => vec![format!("finished: {state}")],
            Self::Claimable => {
                vec!["nothing holds it: the next claim of its queue may take it".into()]
            }
            Self::Held(holds) => holds.iter().map(ToString::to_string).collect(),
        }
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotBefore(t) => write!(f, "not before {} (its run_at)", stamp(*t)),
            Self::Backoff {
                until,
                attempts,
                max_attempts,
            } => write!(
                f,
                "retrying at {} after attempt {attempts} of {max_attempts}",
                stamp(*until)
            ),
            Self::Stage {
                batch,
                stage,
                waiting_for,
                unfinished,
            } => {
                let jobs = if *unfinished == 1 { "job" } else { "jobs" };
                write!(
                    f,
                    "stage {stage} of batch {batch} waits for stage {waiting_for}: \
                     {unfinished} {jobs} unfinished below it"
                )
            }
            Self::After { jobs, more } => {
                let names: Vec<String> = jobs.iter().map(|id| format!("job {id}")).collect();
                let more = if *more { " and more" } else { "" };
                write!(f, "runs after {}{more}, not finished yet", names.join(", "))
            }
            Self::Group {
                group,
                holder: Some(id),
            } => write!(
                f,
                "group {group} is held by job {id}, running or retrying until it ends"
            ),
            Self::Group {
                group,
                holder: None,
            } => write!(
                f,
                "group {group} goes in order: an earlier job of it goes first"
            ),
            Self::Paused => write!(f, "its queue is paused"),
            Self::MaxRunning {
                max,
                running,
                holders,
            } => {
                write!(f, "its queue runs {running} of at most {max} jobs")?;
                for (i, (id, worker)) in holders.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { ", " };
                    write!(f, "{sep}job {id} on {worker}")?;
                }
                Ok(())
            }
            Self::Key {
                key,
                running,
                limit,
            } => write!(
                f,
                "its limit key {key} runs {running} of at most {limit} jobs"
            ),
            Self::Rate { rate, next } => write!(
                f,
                "its queue's rate of {rate} allows the next start at {}",
                stamp(*next)
            ),
            Self::KeyRate { key, rate, next } => write!(
                f,
                "its limit key {key}'s rate of {rate} allows the key's next start at {}",
                stamp(*next)
            ),
        }
    }
}

/// A time as the lines show it: UTC, to the second.
fn stamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
