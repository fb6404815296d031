-- The attempts a job was enqueued with, kept from its first dead retry on: each retry
-- adds it to max_attempts so that attempt numbers go on (SPEC M2). NULL until then.
ALTER TABLE {s}.jobs ADD COLUMN budget smallint;
ALTER TABLE {s}.finished ADD COLUMN budget smallint;
-- A batch's name, for people (SPEC B1).
ALTER TABLE {s}.batches ADD COLUMN name text;
