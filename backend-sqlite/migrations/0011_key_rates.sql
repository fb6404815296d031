-- Rates of limit keys (SPEC K12). The rate of every key without one of its own, as a
-- queue's rate is stored (0010):
ALTER TABLE relayq_queues ADD COLUMN key_rate_count INTEGER;
ALTER TABLE relayq_queues ADD COLUMN key_rate_per_us INTEGER;
ALTER TABLE relayq_queues ADD COLUMN key_rate_burst INTEGER;
-- One row per key that has a rate: its own (NULL under the default), when its next
-- start is due (`tat`, microseconds since the Unix epoch, NULL before the first), and
-- when a claim that parked its jobs for the rate set them to go back (`wake_at`). A
-- key whose rate is lifted loses its row, so a queue with rows has rated keys.
CREATE TABLE relayq_key_rates (
    queue       TEXT    NOT NULL,
    limit_key   TEXT    NOT NULL,
    rate_count  INTEGER,
    rate_per_us INTEGER,
    rate_burst  INTEGER,
    tat         INTEGER,
    wake_at     INTEGER,
    PRIMARY KEY (queue, limit_key)
) WITHOUT ROWID;
-- The keys whose parked jobs go back at a time, earliest first.
CREATE INDEX relayq_key_rates_wake ON relayq_key_rates (queue, wake_at)
    WHERE wake_at IS NOT NULL;
