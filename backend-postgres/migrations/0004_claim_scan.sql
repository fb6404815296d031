-- The claim's scan of a queue's head, in a function whose settings leave the planner
-- one plan: the claim index read in order, stopping after `lim` rows.
--
-- Why: on a large table without column statistics (before autoanalyze's first pass,
-- or on a server with autovacuum off), PostgreSQL guessed that a queue held three rows
-- and read the whole queue through a bitmap scan to sort it, on every claim. Statistics
-- fix it only until a new queue fills faster than they are refreshed. Turning sorts
-- and bitmap scans off leaves the ordered index scan as the one plan without a
-- penalty, whatever the estimates. A function's `SET` applies to the plans of the
-- statements inside it only, and costs no round trip; PL/pgSQL keeps its plan per
-- session, as a prepared statement would.
--
-- The rows are locked `FOR NO KEY UPDATE SKIP LOCKED` (SPEC C3, C4), and the locks
-- last until the calling statement's transaction ends.
CREATE FUNCTION {s}.claim_ready(q text, lim bigint)
RETURNS TABLE (id bigint, state text, attempts smallint, worker text,
               started_at timestamptz, priority smallint, run_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT j.id, j.state, j.attempts, j.worker, j.started_at, j.priority, j.run_at
        FROM {s}.jobs j
        WHERE j.queue = q AND j.state IN ('ready', 'retrying') AND j.run_at <= now()
        ORDER BY j.priority, j.run_at, j.id
        LIMIT lim
        FOR NO KEY UPDATE OF j SKIP LOCKED;
END
$$;
