-- Each key's waiting jobs that no claim set aside, in claim order: an enqueue counts
-- the ones due ahead of its new jobs, and parks a new job that has its key's limit of
-- them ahead (SPEC K4; `enqueue::PARK_NEW`).
CREATE INDEX relayq_jobs_key_waiting ON relayq_jobs (queue, limit_key, priority, run_at, id)
    WHERE state IN ('ready', 'retrying') AND parked = 0 AND limit_key IS NOT NULL;
