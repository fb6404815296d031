-- Limit keys (SPEC K). A job's key, and whether a claim set it aside ("parked") because
-- its key was full: a parked job leaves the claim index, so claims stop reading the
-- waiting jobs of a full key, however many there are (SPEC K4).
ALTER TABLE relayq_jobs ADD COLUMN limit_key TEXT;
ALTER TABLE relayq_jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
-- The limit of every key without one of its own.
ALTER TABLE relayq_queues ADD COLUMN key_limit INTEGER;
-- Keys' own limits.
CREATE TABLE relayq_key_limits (
    queue     TEXT    NOT NULL,
    limit_key TEXT    NOT NULL,
    max       INTEGER NOT NULL,
    PRIMARY KEY (queue, limit_key)
) WITHOUT ROWID;

DROP INDEX relayq_jobs_claim;
CREATE INDEX relayq_jobs_claim ON relayq_jobs (queue, priority, run_at, id)
    WHERE state IN ('ready', 'retrying') AND parked = 0;
-- Running jobs per key, for the claim's count.
CREATE INDEX relayq_jobs_key_running ON relayq_jobs (queue, limit_key)
    WHERE limit_key IS NOT NULL AND state = 'running';
-- Each key's parked jobs, earliest first.
CREATE INDEX relayq_jobs_parked ON relayq_jobs (queue, limit_key, priority, run_at, id)
    WHERE parked = 1 AND state IN ('ready', 'retrying');

-- A job leaving `running` frees one slot of its key, so the earliest parked job of the
-- key goes back to the claim index, in the same transaction, whatever took it out
-- (a settle, a release, a cancel, an expiry, a halt, a delete). A raised limit unparks
-- the queue's jobs itself.
CREATE TRIGGER relayq_key_freed AFTER UPDATE OF state ON relayq_jobs
WHEN OLD.state = 'running' AND NEW.state <> 'running' AND OLD.limit_key IS NOT NULL
BEGIN
    UPDATE relayq_jobs SET parked = 0
    WHERE id = (SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_parked
                WHERE queue = OLD.queue AND limit_key = OLD.limit_key AND parked = 1
                  AND state IN ('ready', 'retrying')
                ORDER BY priority, run_at, id LIMIT 1);
END;
CREATE TRIGGER relayq_key_freed_by_delete AFTER DELETE ON relayq_jobs
WHEN OLD.state = 'running' AND OLD.limit_key IS NOT NULL
BEGIN
    UPDATE relayq_jobs SET parked = 0
    WHERE id = (SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_parked
                WHERE queue = OLD.queue AND limit_key = OLD.limit_key AND parked = 1
                  AND state IN ('ready', 'retrying')
                ORDER BY priority, run_at, id LIMIT 1);
END;
-- A job that goes back to `blocked` (its group's turn went to an earlier job, SPEC G2)
-- leaves its parking too: when it is promoted again, its key may have room, and no
-- slot would free to put it back.
CREATE TRIGGER relayq_blocked_unparks AFTER UPDATE OF state ON relayq_jobs
WHEN NEW.state = 'blocked' AND NEW.parked = 1
BEGIN
    UPDATE relayq_jobs SET parked = 0 WHERE id = NEW.id;
END;
-- An unparked waiting job that leaves without being claimed (cancelled, or sent back
-- to `blocked` by its group) may be the one a freed slot put back: its key's next
-- parked job goes back in its place. An extra one costs nothing: the next claim parks
-- it again if its key is full.
CREATE TRIGGER relayq_key_passed_on AFTER UPDATE OF state ON relayq_jobs
WHEN OLD.state IN ('ready', 'retrying') AND OLD.parked = 0 AND OLD.limit_key IS NOT NULL
  AND NEW.state NOT IN ('ready', 'retrying', 'running')
BEGIN
    UPDATE relayq_jobs SET parked = 0
    WHERE id = (SELECT id FROM relayq_jobs INDEXED BY relayq_jobs_parked
                WHERE queue = OLD.queue AND limit_key = OLD.limit_key AND parked = 1
                  AND state IN ('ready', 'retrying')
                ORDER BY priority, run_at, id LIMIT 1);
END;
