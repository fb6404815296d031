-- Each worker's last beat to a queue it serves (SPEC M9): one row per queue and
-- worker, replaced every few seconds, removed an hour after its last beat.
CREATE TABLE {s}.workers (
    queue     text        NOT NULL,
    name      text        NOT NULL,
    beat      text        NOT NULL,
    last_seen timestamptz NOT NULL,
    PRIMARY KEY (queue, name)
);
