-- Projects and environments can be deleted. They are kept, marked, so that the runs made with them
-- still read whole; a deleted one is invisible to the API and can no longer be given to a job.

ALTER TABLE projects ADD COLUMN deleted_at timestamptz;
ALTER TABLE environments ADD COLUMN deleted_at timestamptz;
CREATE INDEX jobs_environment_idx ON jobs (environment_id) WHERE environment_id IS NOT NULL AND deleted_at IS NULL;
