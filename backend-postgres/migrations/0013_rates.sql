-- A queue's rate (SPEC K8): at most rate_count starts per rate_per_us microseconds,
-- rate_burst of them at once. rate_tat is when the next start is due in the generic
-- cell rate algorithm, in microseconds since the Unix epoch on the server's clock
-- (NULL before the first). A queue with a rate claims under its row's lock, as a
-- queue with max_running or limit keys does.
ALTER TABLE {s}.queues ADD COLUMN rate_count integer;
ALTER TABLE {s}.queues ADD COLUMN rate_per_us bigint;
ALTER TABLE {s}.queues ADD COLUMN rate_burst integer;
ALTER TABLE {s}.queues ADD COLUMN rate_tat bigint;
