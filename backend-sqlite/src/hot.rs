//! The statements on the hot path, listed for the tests that check their plans under
//! every state of SQLite's statistics (tests/statistics.rs): a plan chosen from stale
//! statistics can read a whole table on every call. Not an API.

use crate::{admin, after, barrier, claim, enqueue, promote, settle};

/// What a statement's parameter stands for, so a test can bind a value of the kind
/// the backend binds: with `SQLITE_ENABLE_STAT4` (libsqlite3-sys's bundled build) the
/// planner looks at bound values, so a plan checked with NULLs could differ from the
/// one the backend gets.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The queue's name.
    Queue,
    /// A job's id.
    Job,
    /// A lease token (16 bytes).
    Token,
    /// Now, in microseconds since the epoch.
    Now,
    /// A minute from now, in microseconds since the epoch.
    Later,
    /// A batch's id.
    Batch,
    /// A stage of that batch.
    Stage,
    /// A group of the queue.
    Group,
    /// A claim's or a listing's limit.
    Limit,
    /// Any text: a worker, an error, a state, a dedupe key.
    Text,
    /// A JSON array of leases, as `settle::leases_json` makes it.
    Leases,
    /// A JSON array of new jobs, as `enqueue::insert_chunk` makes it.
    NewJobs,
    /// A JSON array of limit keys.
    Keys,
    /// A JSON array of job ids.
    Jobs,
    /// A JSON array of rows that each lead with a job's id, as `after::SET_WAITS`
    /// takes them.
    Rows,
}

/// One statement of the hot path.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Hot {
    /// The backend's name for it: module and constant.
    pub name: &'static str,
    /// The statement, as the backend runs it.
    pub sql: &'static str,
    /// What `?1`, `?2`, ... stand for.
    pub params: &'static [Param],
}

/// Every statement the hot path runs that reads rows: claims, settles, heartbeats,
/// expiry, promotion, enqueues with dedupe keys, batch progress and wait, and the
/// maintenance pass. (`INSERT ... VALUES` statements read nothing and are left out.)
#[doc(hidden)]
#[must_use]
pub fn hot_statements() -> Vec<Hot> {
    use Param::{
        Batch, Group, Job, Jobs, Keys, Later, Leases, Limit, NewJobs, Now, Queue, Rows, Stage,
        Text, Token,
    };
    let hot = |name, sql, params| Hot { name, sql, params };
    vec![
        hot("claim::QUEUE_SETTINGS", claim::QUEUE_SETTINGS, &[Queue]),
        hot("claim::RUNNING_COUNT", claim::RUNNING_COUNT, &[Queue]),
        hot("claim::RATE_TAT", claim::RATE_TAT, &[Queue, Now]),
        hot(
            "claim::CLAIM",
            claim::CLAIM,
            &[Later, Text, Now, Queue, Limit],
        ),
        hot("claim::EXPIRED", claim::EXPIRED, &[Queue, Now]),
        hot("claim::CANDIDATES", claim::CANDIDATES, &[Queue, Now, Limit]),
        hot("claim::KEY_INFO", claim::KEY_INFO, &[Queue, Keys]),
        hot("claim::PARK", claim::PARK, &[Jobs]),
        hot("claim::KEY_RATES", claim::KEY_RATES, &[Queue, Keys]),
        hot("claim::WOKEN", claim::WOKEN, &[Queue, Now]),
        hot(
            "claim::UNPARK_FIRST",
            claim::UNPARK_FIRST,
            &[Queue, Text, Limit],
        ),
        hot("claim::WAKE_DONE", claim::WAKE_DONE, &[Queue, Text]),
        hot(
            "claim::STILL_PARKED",
            claim::STILL_PARKED,
            &[Queue, Text, Now],
        ),
        hot("claim::NEXT_WAKE", claim::NEXT_WAKE, &[Queue]),
        hot(
            "claim::CLAIM_IDS",
            claim::CLAIM_IDS,
            &[Later, Text, Now, Jobs],
        ),
        hot(
            "claim::EXPIRE_ONE",
            claim::EXPIRE_ONE,
            &[Job, Text, Text, Now],
        ),
        hot(
            "settle::COMPLETE",
            settle::COMPLETE,
            &[Job, Token, Now, Queue],
        ),
        hot(
            "settle::FAIL",
            settle::FAIL,
            &[Job, Token, Now, Queue, Later, Text],
        ),
        hot(
            "settle::RELEASE",
            settle::RELEASE,
            &[Job, Token, Now, Queue],
        ),
        hot(
            "settle::HEARTBEAT",
            settle::HEARTBEAT,
            &[Job, Token, Now, Later, Queue],
        ),
        hot(
            "settle::LOG_COMPLETED",
            settle::LOG_COMPLETED,
            &[Now, Leases],
        ),
        hot("settle::COMPLETE_ALL", settle::COMPLETE_ALL, &[Now, Leases]),
        hot("settle::LOST", settle::LOST, &[Leases]),
        hot("settle::PROGRESS", settle::PROGRESS, &[Leases]),
        hot(
            "promote::STAGE_BELOW",
            promote::STAGE_BELOW,
            &[Batch, Stage],
        ),
        hot("promote::HALT_BATCH", promote::HALT_BATCH, &[Batch]),
        hot(
            "promote::HALT_JOBS",
            promote::HALT_JOBS,
            &[Batch, Stage, Now],
        ),
        hot(
            "promote::HALT_LOG",
            promote::HALT_LOG,
            &[Batch, Stage, Now, Text],
        ),
        hot(
            "promote::HALT_GROUPS",
            promote::HALT_GROUPS,
            &[Batch, Stage],
        ),
        hot(
            "promote::HALT_STAGE",
            promote::HALT_STAGE,
            &[Batch, Stage, Now],
        ),
        hot("promote::STAGE_FLOOR", promote::STAGE_FLOOR, &[Batch]),
        hot(
            "promote::RAISE_STAGE",
            promote::RAISE_STAGE,
            &[Batch, Stage],
        ),
        hot(
            "promote::RELEASE_UNGROUPED",
            promote::RELEASE_UNGROUPED,
            &[Batch, Stage],
        ),
        hot(
            "promote::STAGE_GROUPS",
            promote::STAGE_GROUPS,
            &[Batch, Stage],
        ),
        hot("promote::GROUP_BUSY", promote::GROUP_BUSY, &[Queue, Group]),
        hot("promote::GROUP_HEAD", promote::GROUP_HEAD, &[Queue, Group]),
        hot(
            "promote::GROUP_DEMOTE",
            promote::GROUP_DEMOTE,
            &[Queue, Group, Job],
        ),
        hot("promote::GROUP_PROMOTE", promote::GROUP_PROMOTE, &[Job]),
        hot(
            "after::CANCEL_CHILDREN",
            after::CANCEL_CHILDREN,
            &[Job, Now, Text],
        ),
        hot("after::COUNT_OFF", after::COUNT_OFF, &[Jobs]),
        hot("after::READY", after::READY, &[Jobs]),
        hot("after::PARENTS", after::PARENTS, &[Jobs, Queue]),
        hot("after::SET_WAITS", after::SET_WAITS, &[Rows]),
        hot("after::SET_CANCELLED", after::SET_CANCELLED, &[Rows, Now]),
        hot("enqueue::DUPLICATE", enqueue::DUPLICATE, &[Queue, Text]),
        hot("enqueue::KEYED", enqueue::KEYED, &[Queue]),
        hot("enqueue::PARK_NEW", enqueue::PARK_NEW, &[Queue, Jobs, Now]),
        hot(
            "enqueue::OPEN_BATCH_STAGE",
            enqueue::OPEN_BATCH_STAGE,
            &[Batch, Queue],
        ),
        hot(
            "enqueue::INSERT_ALL",
            enqueue::INSERT_ALL,
            &[Queue, Now, NewJobs],
        ),
        hot("barrier::REACHED", barrier::REACHED, &[Batch, Queue]),
        hot(
            "barrier::BATCH_SETTINGS",
            barrier::BATCH_SETTINGS,
            &[Batch, Queue],
        ),
        hot("barrier::BATCH_COUNTS", barrier::BATCH_COUNTS, &[Batch]),
        hot(
            "admin::PRUNE_ATTEMPTS",
            admin::PRUNE_ATTEMPTS,
            &[Queue, Now],
        ),
        hot("admin::PRUNE_EDGES", admin::PRUNE_EDGES, &[Queue, Now]),
        hot("admin::PRUNE_JOBS", admin::PRUNE_JOBS, &[Queue, Now]),
        hot("admin::PRUNE_BATCHES", admin::PRUNE_BATCHES, &[Queue]),
        hot(
            "admin::PRUNE_KEY_RATES",
            admin::PRUNE_KEY_RATES,
            &[Queue, Now],
        ),
    ]
}
