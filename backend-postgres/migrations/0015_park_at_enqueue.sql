-- Each key's waiting jobs that no claim set aside, in claim order: relayq's enqueue
-- counts the ones due ahead of its new jobs, and parks a new job that has 64 of them
-- ahead (SPEC K4; `enqueue::PARK_NEW`).
CREATE INDEX jobs_key_waiting ON {s}.jobs (queue, limit_key, priority, run_at, id)
    WHERE state IN ('ready', 'retrying') AND NOT parked AND limit_key IS NOT NULL;
