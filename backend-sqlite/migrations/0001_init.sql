-- relayq schema for SQLite. Times are microseconds since the Unix epoch (UTC).
--
-- Job states: ready (claimable once run_at has passed), blocked (waits for its group or
-- its stage), running, retrying, succeeded, dead, cancelled. Groups and stages work by
-- promotion: a job becomes ready only when its group and stage allow, so a claim is a
-- plain ordered scan of the claim index.

CREATE TABLE relayq_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    payload          BLOB    NOT NULL,
    priority         INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    group_key        TEXT,
    batch_id         INTEGER,
    stage            INTEGER,
    dedupe_key       TEXT,
    enqueued_by      TEXT,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    last_error       TEXT,
    -- The running attempt: its lease and where it runs.
    lease_token      BLOB,
    lease_expires_at INTEGER,
    worker           TEXT,
    started_at       INTEGER
);

-- The claim scan: claimable jobs of a queue in order-key order.
CREATE INDEX relayq_jobs_claim ON relayq_jobs (queue, priority, run_at, id)
    WHERE state IN ('ready', 'retrying');
-- Expired leases and running counts.
CREATE INDEX relayq_jobs_running ON relayq_jobs (queue, lease_expires_at)
    WHERE state = 'running';
-- Group holder and next-in-line look-ups.
CREATE INDEX relayq_jobs_group ON relayq_jobs (queue, group_key, priority, run_at, id)
    WHERE group_key IS NOT NULL AND state IN ('ready', 'blocked', 'running', 'retrying');
-- The lowest unfinished stage of a batch.
CREATE INDEX relayq_jobs_stage ON relayq_jobs (batch_id, stage)
    WHERE batch_id IS NOT NULL AND state IN ('ready', 'blocked', 'running', 'retrying');
-- Batch progress.
CREATE INDEX relayq_jobs_batch ON relayq_jobs (batch_id) WHERE batch_id IS NOT NULL;
-- SPEC E3: one unfinished job per dedupe key and queue.
CREATE UNIQUE INDEX relayq_jobs_dedupe ON relayq_jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('ready', 'blocked', 'running', 'retrying');
-- Counts per state, dead-job listing and pruning.
CREATE INDEX relayq_jobs_state ON relayq_jobs (queue, state, finished_at);

-- The execution log: one row per ended attempt (the running one lives on the job row).
CREATE TABLE relayq_attempts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    worker     TEXT    NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at   INTEGER NOT NULL,
    outcome    TEXT    NOT NULL,
    error      TEXT
);
CREATE INDEX relayq_attempts_job ON relayq_attempts (job_id, id);

CREATE TABLE relayq_queues (
    queue       TEXT PRIMARY KEY,
    paused      INTEGER NOT NULL DEFAULT 0,
    max_running INTEGER
);

CREATE TABLE relayq_batches (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT    NOT NULL,
    on_failure     TEXT    NOT NULL,
    sealed         INTEGER NOT NULL DEFAULT 0,
    failed         INTEGER NOT NULL DEFAULT 0,
    -- High-water mark of released stages (SPEC B3).
    released_stage INTEGER,
    created_at     INTEGER NOT NULL
);
