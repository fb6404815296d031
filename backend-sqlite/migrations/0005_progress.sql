-- A running job's progress as its handler last reported it, as the text
-- `ProgressReport::stored` makes (SPEC L7). Kept after the job finishes.
ALTER TABLE relayq_jobs ADD COLUMN progress TEXT;
