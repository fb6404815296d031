-- SPEC D: dependencies between jobs of one batch.
--
-- Each edge says a child runs after a parent; the key leads with the parent, which a
-- settle looks up. A job's `deps_left` counts its parents not yet finished: the settle
-- that finishes a parent takes one off each of its children, under the batch's lock,
-- and a child becomes ready only at 0 (and when its stage and group allow). Edges stay
-- while their child does: `job` reads a job's parents through `job_deps_child`, and
-- pruning a child deletes its edges.
CREATE TABLE {s}.job_deps (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX job_deps_child ON {s}.job_deps (child_id, parent_id);

ALTER TABLE {s}.jobs
    ADD COLUMN deps_left int NOT NULL DEFAULT 0 CHECK (deps_left >= 0),
    -- 'run' when it runs even after a parent failed; NULL for the default, 'cancel'.
    ADD COLUMN after_failure text;
ALTER TABLE {s}.batches ADD COLUMN after_failure text NOT NULL DEFAULT 'cancel';

-- A group's head is its earliest job whose stage is released and whose parents all
-- finished (SPEC D3): `HEADS` in src/promote.rs gains `deps_left = 0`, and this
-- function, which runs it word for word, is replaced (with migration 0006's setting).
CREATE OR REPLACE FUNCTION {s}.settle_groups(queues text[], grps text[], keys text[], channel text,
                                  notes text[], ready_prefix text)
RETURNS text[]
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
    heads bigint[];
    promoted text[];
BEGIN
    PERFORM count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM unnest(keys) AS k;

    WITH g AS (SELECT * FROM unnest($1::text[], $2::text[]) AS g(queue, grp)),
     st AS MATERIALIZED (
         SELECT g.queue, g.grp,
             EXISTS (SELECT 1 FROM {s}.jobs b
                     WHERE b.queue = g.queue AND b.group_key = g.grp
                       AND b.state IN ('running', 'retrying')) AS busy,
             (SELECT j.id FROM {s}.jobs j
              WHERE j.queue = g.queue AND j.group_key = g.grp
                AND j.state IN ('ready', 'blocked') AND j.deps_left = 0
                AND (j.batch_id IS NULL OR j.stage <= (
                     SELECT min(f.stage) FROM {s}.jobs f WHERE f.batch_id = j.batch_id))
              ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS head
         FROM g),
     demoted AS (
         UPDATE {s}.jobs j SET state = 'blocked' FROM st
         WHERE NOT st.busy AND j.queue = st.queue AND j.group_key = st.grp
           AND j.state = 'ready' AND j.id IS DISTINCT FROM st.head)
     SELECT array_agg(head) FROM st WHERE NOT busy AND head IS NOT NULL
    INTO heads;

    IF heads IS NOT NULL THEN
        WITH p AS (
     UPDATE {s}.jobs j SET state = 'ready'
     WHERE j.id = ANY(heads) AND j.state = 'blocked'
       AND NOT EXISTS (SELECT 1 FROM {s}.jobs b
                       WHERE b.queue = j.queue AND b.group_key = j.group_key
                         AND b.state IN ('running', 'retrying'))
     RETURNING j.queue)
        SELECT array_agg(DISTINCT queue) FROM p INTO promoted;
    END IF;

    PERFORM count(pg_notify(channel, n))
    FROM (SELECT unnest(notes) UNION SELECT ready_prefix || unnest(promoted)) AS x(n);
    RETURN promoted;
END
$$;
