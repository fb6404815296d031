-- Schedules (SPEC S). `mark` is the last slot handled: a slot fires only by moving it
-- forward, in the transaction that stores the slot's jobs. `definition` is JSON only
-- relayq's core reads. The primary key is the only access path: every statement
-- names (queue, name), or lists one queue's schedules.
CREATE TABLE {s}.schedules (
    queue      text        NOT NULL,
    name       text        NOT NULL,
    definition text        NOT NULL,
    version    bigint      NOT NULL,
    mark       timestamptz NOT NULL,
    paused     boolean     NOT NULL DEFAULT false,
    last_slot  timestamptz,
    last_job   bigint,
    last_batch bigint,
    PRIMARY KEY (queue, name)
);
