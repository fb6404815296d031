-- Schedules (SPEC S). `mark` is the last slot handled, in microseconds since the
-- epoch: a slot fires only by moving it forward, in the transaction that stores the
-- slot's jobs. `definition` is JSON only relayq's core reads.
CREATE TABLE relayq_schedules (
    queue      TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    definition TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    mark       INTEGER NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    last_slot  INTEGER,
    last_job   INTEGER,
    last_batch INTEGER,
    PRIMARY KEY (queue, name)
) WITHOUT ROWID;
