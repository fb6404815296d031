-- When each logged attempt was claimed (microseconds since the Unix epoch), kept
-- apart from its start: the claim plus the job's wait in the worker's buffer
-- (SPEC L5). NULL for attempts logged before.
ALTER TABLE relayq_attempts ADD COLUMN claimed_at INTEGER;
