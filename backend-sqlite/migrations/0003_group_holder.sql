-- Each group's live jobs: its holder, and for a moment a ready job being demoted. The
-- group settle asks "is a job of this group running or retrying?" and "which of its
-- jobs are ready?" here; through relayq_jobs_group each question read every unfinished
-- job of the group, on every settle of a grouped job.
CREATE INDEX relayq_jobs_holder ON relayq_jobs (queue, group_key)
    WHERE group_key IS NOT NULL AND state IN ('ready', 'running', 'retrying');
