-- Limit keys (SPEC K). A job's key, and whether a claim set it aside ("parked") because
-- its key was full: a parked job leaves the claim index, so claims stop reading the
-- waiting jobs of a full key, however many there are (SPEC K4).
ALTER TABLE {s}.jobs ADD COLUMN limit_key text;
ALTER TABLE {s}.jobs ADD COLUMN parked boolean NOT NULL DEFAULT false;
ALTER TABLE {s}.finished ADD COLUMN limit_key text;
-- The limit of every key without one of its own, and whether the queue has any key
-- limit at all: its claims then take the queue's lock (src/claim.rs).
ALTER TABLE {s}.queues ADD COLUMN key_limit integer;
ALTER TABLE {s}.queues ADD COLUMN keyed boolean NOT NULL DEFAULT false;
-- Keys' own limits.
CREATE TABLE {s}.key_limits (
    queue     text    NOT NULL,
    limit_key text    NOT NULL,
    max       integer NOT NULL,
    PRIMARY KEY (queue, limit_key)
);

DROP INDEX {s}.jobs_claim;
CREATE INDEX jobs_claim ON {s}.jobs (queue, priority, run_at, id)
    WHERE state IN ('ready', 'retrying') AND NOT parked;
-- Running jobs per key, for the claim's count.
CREATE INDEX jobs_key_running ON {s}.jobs (queue, limit_key)
    WHERE limit_key IS NOT NULL AND state = 'running';
-- Each key's parked jobs, earliest first.
CREATE INDEX jobs_parked ON {s}.jobs (queue, limit_key, priority, run_at, id)
    WHERE parked AND state IN ('ready', 'retrying');

-- The claim's scan (0004), passing over parked jobs.
CREATE OR REPLACE FUNCTION {s}.claim_ready(q text, lim bigint)
RETURNS TABLE (id bigint, state text, attempts smallint, worker text,
               started_at timestamptz, priority smallint, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 1
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT j.id, j.state, j.attempts, j.worker, j.started_at, j.priority, j.run_at
        FROM {s}.jobs j
        WHERE j.queue = q AND j.state IN ('ready', 'retrying') AND NOT j.parked
          AND j.run_at <= now()
        ORDER BY j.priority, j.run_at, j.id
        LIMIT lim
        FOR NO KEY UPDATE OF j SKIP LOCKED;
END
$$;

-- A job leaving `running` frees one slot of its key, so the earliest parked job of the
-- key goes back to the claim index, in the same transaction, whatever took it out (a
-- settle, a release, a cancel, an expiry, a halt, a delete). So does an unparked
-- waiting job that leaves without being claimed (cancelled, deleted, or sent back to
-- `blocked` by its group): it may be the one a freed slot put back, and its key's
-- next job must not stay parked behind it. An extra unpark costs nothing but a read:
-- the next claim parks the job again if its key is full.
--
-- Why the queue row's lock: a keyed claim holds it `FOR UPDATE` while it counts the
-- key's running jobs and parks what found the key full. Taking it `FOR KEY SHARE` here
-- waits for such a claim to commit, and the unpark that follows (a new snapshot, as
-- each statement of a VOLATILE function takes) then sees what it parked. A claim that
-- comes after waits for this transaction, and counts the slot freed. Without the lock
-- a claim could park a job after this unpark looked, and the job would wait with its
-- key free. `SKIP LOCKED`: two settles of one key each unpark a different job.
CREATE FUNCTION {s}.key_freed() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM 1 FROM {s}.queues WHERE queue = OLD.queue FOR KEY SHARE;
    UPDATE {s}.jobs SET parked = false
    WHERE id = (SELECT p.id FROM {s}.jobs p
                WHERE p.queue = OLD.queue AND p.limit_key = OLD.limit_key AND p.parked
                  AND p.state IN ('ready', 'retrying')
                ORDER BY p.priority, p.run_at, p.id LIMIT 1
                FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_key_freed AFTER UPDATE OF state ON {s}.jobs
    FOR EACH ROW
    WHEN (OLD.limit_key IS NOT NULL AND (
        (OLD.state = 'running' AND NEW.state <> 'running')
        OR (OLD.state IN ('ready', 'retrying') AND NOT OLD.parked
            AND NEW.state NOT IN ('ready', 'retrying', 'running'))))
    EXECUTE FUNCTION {s}.key_freed();
CREATE TRIGGER jobs_key_freed_by_delete AFTER DELETE ON {s}.jobs
    FOR EACH ROW
    WHEN (OLD.limit_key IS NOT NULL AND (
        OLD.state = 'running' OR (OLD.state IN ('ready', 'retrying') AND NOT OLD.parked)))
    EXECUTE FUNCTION {s}.key_freed();

-- A job that goes back to `blocked` (its group's turn went to an earlier job, SPEC G2)
-- leaves its parking too: when it is promoted again, its key may have room, and no
-- slot would free to put it back.
CREATE FUNCTION {s}.blocked_unparks() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.parked := false;
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_blocked_unparks BEFORE UPDATE OF state ON {s}.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'blocked' AND NEW.parked)
    EXECUTE FUNCTION {s}.blocked_unparks();
