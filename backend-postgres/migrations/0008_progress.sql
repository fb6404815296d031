-- A running job's progress as its handler last reported it, as the text
-- `ProgressReport::stored` makes (SPEC L7); moved to `finished` with its row. Not
-- indexed, so a report's update stays a heap-only update.
ALTER TABLE {s}.jobs ADD COLUMN progress text;
ALTER TABLE {s}.finished ADD COLUMN progress text;
