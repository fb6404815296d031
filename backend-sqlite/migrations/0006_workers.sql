-- Each worker's last beat to a queue it serves (SPEC M9): one row per queue and
-- worker, replaced every few seconds, removed an hour after its last beat. Times are
-- microseconds since the Unix epoch.
CREATE TABLE relayq_workers (
    queue     TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    beat      TEXT    NOT NULL,
    last_seen INTEGER NOT NULL,
    PRIMARY KEY (queue, name)
);
