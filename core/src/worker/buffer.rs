//! Claimed jobs waiting for a free slot: the prefetch buffer (automatic by default, see
//! `pace`).
//!
//! A buffered job holds its lease on the server (so it counts under `max_running` and
//! blocks its group) but is not heartbeated. It is therefore held for at most one
//! heartbeat interval: a job still waiting then is released, so its lease never comes
//! near expiry and it never burns an attempt by sitting here.

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

use crate::ClaimedJob;

pub(super) struct Buffer {
    /// Jobs in claim order, each with the moment it was claimed.
    jobs: VecDeque<(Instant, ClaimedJob)>,
    /// Longest a job may wait here.
    hold: Duration,
    /// Set when a job leaves for a slot; cleared when a claim starts. Refilling ahead
    /// of free slots is only worth it while jobs are leaving (short jobs): with long
    /// jobs the buffer would just be claimed, held and released over and over.
    consumed: bool,
    /// How many of the jobs are of each queue, kept as jobs come and go (a worker
    /// serves a few queues: a list beats a map), for the worker's beat.
    per_queue: Vec<(String, u32)>,
}

impl Buffer {
    pub(super) fn new(hold: Duration) -> Self {
        Self {
            jobs: VecDeque::new(),
            hold,
            consumed: false,
            per_queue: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> u32 {
        u32::try_from(self.jobs.len()).unwrap_or(u32::MAX)
    }

    /// How many of the jobs held here are of `queue`.
    pub(super) fn held_of(&self, queue: &str) -> u32 {
        self.per_queue
            .iter()
            .find(|(q, _)| q == queue)
            .map_or(0, |(_, n)| *n)
    }

    /// Counts `job` in (`up`) or out of its queue's tally.
    fn tally(&mut self, job: &ClaimedJob, up: bool) {
        let queue = &job.lease.queue;
        match self.per_queue.iter_mut().find(|(q, _)| q == queue) {
            Some((_, n)) if up => *n += 1,
            Some((_, n)) => *n = n.saturating_sub(1),
            None if up => self.per_queue.push((queue.clone(), 1)),
            None => {}
        }
    }

    /// Adds a claim's jobs, kept in claim-start order: two claims in flight may come
    /// back in either order, and expiry only looks at the front.
    pub(super) fn push(&mut self, jobs: Vec<(Instant, ClaimedJob)>) {
        for (claimed_at, job) in jobs {
            self.tally(&job, true);
            let at = self.jobs.partition_point(|(t, _)| *t <= claimed_at);
            self.jobs.insert(at, (claimed_at, job));
        }
    }

    /// Whether the oldest job may go to a slot at `now` (see [`pop`](Self::pop)).
    pub(super) fn startable(&self, now: Instant) -> bool {
        self.jobs
            .front()
            .is_some_and(|(at, _)| *at + self.hold > now)
    }

    /// The oldest job, for a free slot, unless it was held for `hold` or longer at
    /// `now`: that one goes back with [`take_expired`](Self::take_expired), never to a
    /// slot. A worker frozen (SIGSTOP, a paused VM) with jobs here finds them so when it
    /// thaws, their leases perhaps long run out and their jobs run elsewhere; starting
    /// one would run it beside (or after) its next attempt.
    pub(super) fn pop(&mut self, now: Instant) -> Option<(Instant, ClaimedJob)> {
        if self
            .jobs
            .front()
            .is_some_and(|(at, _)| *at + self.hold <= now)
        {
            return None;
        }
        let job = self.jobs.pop_front();
        if let Some((_, j)) = &job {
            self.tally(j, false);
        }
        self.consumed |= job.is_some();
        job
    }

    /// Whether jobs left for slots since the last claim started.
    pub(super) fn consumed(&self) -> bool {
        self.consumed
    }

    pub(super) fn claim_started(&mut self) {
        self.consumed = false;
    }

    /// When the oldest job must be released, if any is buffered.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.jobs.front().map(|(at, _)| *at + self.hold)
    }

    /// Removes the jobs held for `hold` or longer at `now`. Jobs that expire here are
    /// not leaving fast, so refilling ahead waits for the next job to leave.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<(Instant, ClaimedJob)> {
        let n = self
            .jobs
            .iter()
            .take_while(|(at, _)| *at + self.hold <= now)
            .count();
        if n > 0 {
            self.consumed = false;
        }
        let out: Vec<(Instant, ClaimedJob)> = self.jobs.drain(..n).collect();
        for (_, j) in &out {
            self.tally(j, false);
        }
        out
    }

    /// Removes every job (shutdown).
    pub(super) fn take_all(&mut self) -> Vec<(Instant, ClaimedJob)> {
        self.per_queue.clear();
        self.jobs.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{JobId, worker::slots::tests::job};

    /// A job held past the hold (the worker was frozen) is never handed to a slot: it
    /// is only released.
    #[test]
    fn a_job_held_too_long_goes_back_not_to_a_slot() {
        let hold = Duration::from_secs(10);
        let mut b = Buffer::new(hold);
        let t0 = Instant::now();
        b.push(vec![(t0, job(1)), (t0, job(2))]);
        assert_eq!(
            b.pop(t0 + Duration::from_secs(1)).map(|(_, j)| j.lease.job),
            Some(JobId(1))
        );
        assert!(
            b.pop(t0 + hold).is_none(),
            "a job past its hold went to a slot"
        );
        assert_eq!(b.held_of("q"), 1, "one job of q is held");
        let back = b.take_expired(t0 + hold);
        assert_eq!(b.held_of("q"), 0, "the expired job was counted out");
        assert_eq!(
            back.iter().map(|(_, j)| j.lease.job).collect::<Vec<_>>(),
            [JobId(2)]
        );
    }
}
