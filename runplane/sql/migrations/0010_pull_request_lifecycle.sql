-- Why a run was asked to stop when it was not its user (a newer commit of its pull request, the
-- pull request closed): a run that then ends cancelled shows this as its status message.
ALTER TABLE runs ADD COLUMN cancel_reason text NOT NULL DEFAULT '';
-- A new CI run of a pull request looks up that pull request's older CI runs still in progress.
CREATE INDEX runs_pull_request_active_idx ON runs (job_id, pull_request_number, id)
    WHERE status IN (1, 2, 3) AND pull_request_number IS NOT NULL;

-- The schema of each CI job and pull request that a CI run was queued into, so that closing the
-- pull request, or the sweep of old ones, drops it. drop_run_id: the run queued to drop it (the
-- row is in use again, drop_run_id NULL, when a later CI run of the pull request is queued).
CREATE TABLE pull_request_schemas (
    job_id               bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    pull_request_number  integer NOT NULL,
    account_id           bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    schema_name          text NOT NULL,
    last_run_id          bigint NOT NULL,           -- no foreign key: retention may delete the run
    last_used_at         timestamptz NOT NULL DEFAULT now(),
    drop_run_id          bigint,
    PRIMARY KEY (job_id, pull_request_number)
);
CREATE INDEX pull_request_schemas_sweep_idx ON pull_request_schemas (last_used_at) WHERE drop_run_id IS NULL;

-- Days after its last CI run that a pull request's schema is dropped by the sweep; 0: never.
ALTER TABLE accounts ADD COLUMN pull_request_schema_max_age_days integer NOT NULL DEFAULT 14
    CHECK (pull_request_schema_max_age_days >= 0);
