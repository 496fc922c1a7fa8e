-- Deferral and Slim CI. A job may defer to another job, or to an environment (its deploy jobs):
-- each run then starts from the manifest.json of the latest successful run there, recorded on the
-- run (deferring_run_id; no foreign key: retention may delete that run), and its dbt steps get
-- --defer --state. run_only_modified: the dbt steps select state:modified+ against that manifest.
ALTER TABLE jobs ADD COLUMN defer_to_job_id bigint REFERENCES jobs (id) ON DELETE SET NULL;
ALTER TABLE jobs ADD COLUMN defer_to_environment_id bigint REFERENCES environments (id) ON DELETE SET NULL;
ALTER TABLE jobs ADD COLUMN run_only_modified boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD CONSTRAINT jobs_one_deferral CHECK (defer_to_job_id IS NULL OR defer_to_environment_id IS NULL);
ALTER TABLE runs ADD COLUMN deferring_run_id bigint;
