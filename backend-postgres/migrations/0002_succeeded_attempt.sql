-- The attempt that succeeded stays on its `finished` row instead of a row of its own in
-- `attempts`: one row less written per successful job. It ran on `worker` from
-- `started_at` to `finished_at` and returned `output`. NULL on rows that finished
-- otherwise, and on rows finished before this version (their attempt is in `attempts`).
ALTER TABLE {s}.finished
    ADD COLUMN worker     text,
    ADD COLUMN started_at timestamptz,
    ADD COLUMN output     text;
