-- The attempts a job was enqueued with, kept from its first dead retry on: each retry
-- adds it to max_attempts so that attempt numbers go on (SPEC M2). NULL until then.
ALTER TABLE relayq_jobs ADD COLUMN budget INTEGER;
-- A batch's name, for people (SPEC B1).
ALTER TABLE relayq_batches ADD COLUMN name TEXT;
