-- CreateJob's idempotency key: a retried create returns the job the first one created.
ALTER TABLE jobs ADD COLUMN create_key text;
CREATE UNIQUE INDEX jobs_create_key_idx ON jobs (account_id, create_key) WHERE create_key IS NOT NULL;
