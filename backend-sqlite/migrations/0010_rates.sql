-- A queue's rate (SPEC K8): at most rate_count starts per rate_per_us microseconds,
-- rate_burst of them at once; rate_tat is when the next start is due in the generic
-- cell rate algorithm (microseconds since the Unix epoch, NULL before the first).
ALTER TABLE relayq_queues ADD COLUMN rate_count INTEGER;
ALTER TABLE relayq_queues ADD COLUMN rate_per_us INTEGER;
ALTER TABLE relayq_queues ADD COLUMN rate_burst INTEGER;
ALTER TABLE relayq_queues ADD COLUMN rate_tat INTEGER;
