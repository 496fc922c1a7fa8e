-- Retention: an account's finished runs (with their steps, logs and artifacts, by cascade) older
-- than run_retention_days are deleted by the scheduler loop in bounded batches. 0: kept forever.
ALTER TABLE accounts ADD COLUMN run_retention_days integer NOT NULL DEFAULT 0 CHECK (run_retention_days >= 0);

-- The batches read an account's oldest finished runs from here.
CREATE INDEX runs_retention_idx ON runs (account_id, finished_at) WHERE status IN (10, 20, 30);
-- Deleting a run sets these references to NULL in the runs and the webhook outbox that point at
-- it: without an index each deleted run would scan those tables.
CREATE INDEX runs_parent_run_idx ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_upstream_run_idx ON runs (upstream_run_id) WHERE upstream_run_id IS NOT NULL;
CREATE INDEX webhook_outbox_run_idx ON webhook_outbox (run_id) WHERE run_id IS NOT NULL;
