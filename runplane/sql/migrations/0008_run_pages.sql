-- The run pages list an account's runs newest first, 50 at a time, by (queued_at, id): one index
-- per filter that would otherwise scan a large account's history (the whole account, one status,
-- one cause, one job). The on-time view reads a window of queued_at through the first one.
CREATE INDEX runs_account_queued_idx ON runs (account_id, queued_at DESC, id DESC);
CREATE INDEX runs_account_status_queued_idx ON runs (account_id, status, queued_at DESC, id DESC);
CREATE INDEX runs_account_trigger_queued_idx ON runs (account_id, trigger, queued_at DESC, id DESC);
CREATE INDEX runs_job_queued_idx ON runs (job_id, queued_at DESC, id DESC);
