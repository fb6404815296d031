-- SPEC D: dependencies between jobs of one batch.
--
-- Each edge says a child runs after a parent; the key leads with the parent, which a
-- settle looks up. A job's `deps_left` counts its parents not yet finished: a settle
-- that finishes a parent takes one off each of its children, and a child becomes
-- ready only at 0 (and when its stage and group allow).
CREATE TABLE relayq_job_deps (
    parent_id INTEGER NOT NULL,
    child_id  INTEGER NOT NULL,
    PRIMARY KEY (parent_id, child_id)
) WITHOUT ROWID;
-- A job's own list (`JobInfo::after`), and its edges deleted with it.
CREATE INDEX relayq_job_deps_child ON relayq_job_deps (child_id, parent_id);

ALTER TABLE relayq_jobs ADD COLUMN deps_left INTEGER NOT NULL DEFAULT 0 CHECK (deps_left >= 0);
-- 'run' when it runs even after a parent failed; NULL for the default, 'cancel'.
ALTER TABLE relayq_jobs ADD COLUMN after_failure TEXT;
ALTER TABLE relayq_batches ADD COLUMN after_failure TEXT NOT NULL DEFAULT 'cancel';
