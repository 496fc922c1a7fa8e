-- Cron fires missed for longer than the job's missed-run grace (the platform or the account was
-- down): within catchup_window_seconds of now a new owner still queues them (the newest one, or
-- every one with catchup_all); older ones are recorded in skipped_occurrences with reason 'missed'.
-- 0 keeps the grace alone (DESIGN.md, "Catch-up window").
ALTER TABLE jobs ADD COLUMN catchup_window_seconds integer NOT NULL DEFAULT 0
    CHECK (catchup_window_seconds BETWEEN 0 AND 604800);
ALTER TABLE jobs ADD COLUMN catchup_all boolean NOT NULL DEFAULT false;
