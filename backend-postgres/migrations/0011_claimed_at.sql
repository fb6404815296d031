-- When each logged attempt was claimed, kept apart from its start (the claim plus the
-- job's wait in the worker's buffer, SPEC L5); NULL for attempts logged before. The
-- succeeded attempt lives on its `finished` row.
ALTER TABLE {s}.attempts ADD COLUMN claimed_at timestamptz;
ALTER TABLE {s}.finished ADD COLUMN claimed_at timestamptz;
