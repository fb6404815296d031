-- Gives touched groups their next holder in one round trip: the groups' advisory
-- locks, the head look-up with its demotion (`HEADS` in src/promote.rs), the promotion
-- (`PROMOTE`), and the transaction's notifications, which were four statements and so
-- four round trips, each made while holding the groups' locks.
--
-- Why it is correct as one call: a VOLATILE function takes a new snapshot for each
-- statement it runs (under READ COMMITTED), as separate statements did. So the head
-- look-up sees what the lock's previous holder committed, and the promotion sees
-- claims that committed after the demotion (see `settle_groups` in src/promote.rs for
-- why that order matters).
--
-- The two statements are the Rust constants, word for word but for the promotion's
-- `$1`, here `heads`; a test in src/promote.rs checks that, so the plans
-- `explain_group_holders` shows are the plans this function runs. Changing either
-- constant needs a new migration that replaces this function.
--
-- `notes` are notifications the transaction still owes; they are sent here with a
-- ready notification for each queue where a head was promoted (`ready_prefix` ||
-- queue). PostgreSQL delivers identical notifications of one transaction once.
-- Returns the queues where a head was promoted (NULL for none).
CREATE FUNCTION {s}.settle_groups(queues text[], grps text[], keys text[], channel text,
                                  notes text[], ready_prefix text)
RETURNS text[]
LANGUAGE plpgsql VOLATILE
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
                AND j.state IN ('ready', 'blocked')
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
