-- What a worker reported with an attempt's outcome, e.g. a command's output (SPEC L5).
ALTER TABLE relayq_attempts ADD COLUMN output TEXT;
