-- `settle_groups` asks whether a group has a running or retrying job through
-- `jobs_holder`, which holds only a group's live jobs. With statistics that say no job
-- is running (a table analyzed while everything waited), the planner read that answer
-- from a sequential scan of the whole table instead, on every settle of a grouped job
-- (tests/statistics.rs, "giant groups"). The function's statements run with
-- sequential scans off, as `claim_ready`'s do; the body is unchanged.
ALTER FUNCTION {s}.settle_groups(text[], text[], text[], text, text[], text)
    SET enable_seqscan = off;
