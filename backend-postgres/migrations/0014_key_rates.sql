-- Rates of limit keys (SPEC K12). The rate of every key without one of its own, as a
-- queue's rate is stored (0013):
ALTER TABLE {s}.queues ADD COLUMN key_rate_count integer;
ALTER TABLE {s}.queues ADD COLUMN key_rate_per_us bigint;
ALTER TABLE {s}.queues ADD COLUMN key_rate_burst integer;
-- Whether any key of the queue has a rate: read from the queue row a claim locks, so a
-- claim that waited for the lock sees a rate set meanwhile (a subquery would read the
-- statement's snapshot, taken before the wait).
ALTER TABLE {s}.queues ADD COLUMN key_rated boolean NOT NULL DEFAULT false;
-- One row per key that has a rate: its own (NULL under the default), when its next
-- start is due (`tat`, microseconds since the Unix epoch on the server's clock, NULL
-- before the first), and when a claim that parked its jobs for the rate set them to go
-- back (`wake_at`, the same clock). A key whose rate is lifted loses its row. Claims
-- of a queue with key rates hold its row's lock (`keyed`), which makes each key's
-- rate exact.
CREATE TABLE {s}.key_rates (
    queue       text    NOT NULL,
    limit_key   text    NOT NULL,
    rate_count  integer,
    rate_per_us bigint,
    rate_burst  integer,
    tat         bigint,
    wake_at     bigint,
    PRIMARY KEY (queue, limit_key)
);
-- The keys whose parked jobs go back at a time, earliest first.
CREATE INDEX key_rates_wake ON {s}.key_rates (queue, wake_at) WHERE wake_at IS NOT NULL;
