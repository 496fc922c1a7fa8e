-- Every index of runs is written again on each change of a run's status (a status change is never a
-- HOT update), so each index is paid three times per run on the way to running: queued, starting,
-- running. The run pages now list newest first by id, over the indexes the REST API and gRPC
-- ListRuns already walk (runs_account_idx, runs_job_idx), instead of a full index per filter.
-- The filters that would otherwise scan a large account's history get partial indexes a run enters
-- only off the hot path: an ended status (written when the run ends), a cause other than a schedule.
-- runs_account_queued_idx stays for windows of queued_at (the on-time view, since/until).
DROP INDEX runs_account_status_queued_idx;
DROP INDEX runs_account_trigger_queued_idx;
DROP INDEX runs_job_queued_idx;
CREATE INDEX runs_account_ended_idx ON runs (account_id, status, id DESC) WHERE status IN (10, 20, 30);
CREATE INDEX runs_account_trigger_idx ON runs (account_id, trigger, id DESC) WHERE trigger <> 'schedule';
