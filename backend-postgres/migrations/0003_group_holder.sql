-- Each group's live jobs: its holder, and for a moment a ready job being demoted. The
-- group statements ask "is a job of this group running or retrying?" and "which of its
-- jobs are ready?" here. Through `jobs_group` each of those questions read every
-- unfinished job of the group (and the dead row versions its finished ones left), on
-- every settle of a grouped job: time that grew with the group's length.
-- `IF NOT EXISTS`: on a large table, create it `CONCURRENTLY` beforehand (README). A
-- build of that kind that failed leaves an invalid index, which no plan uses: it is
-- dropped and built again here.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('{s}.jobs_holder') AND NOT indisvalid) THEN
        DROP INDEX {s}.jobs_holder;
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS jobs_holder ON {s}.jobs (queue, group_key)
    WHERE group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying');
