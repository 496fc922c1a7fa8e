-- Pausing a job: its definition stays, but nothing automatic queues it (schedule, completion of
-- another job, Git events, automatic retries). Run now and API triggers still queue it, and the
-- run records that its job was paused when it was queued.
ALTER TABLE jobs ADD COLUMN paused_at timestamptz;   -- NULL: not paused
ALTER TABLE runs ADD COLUMN job_paused boolean NOT NULL DEFAULT false;

-- After how many consecutive failed runs a job of the account is deactivated; 0: never.
ALTER TABLE accounts ADD COLUMN deactivate_after_failures integer NOT NULL DEFAULT 100
    CHECK (deactivate_after_failures >= 0);
