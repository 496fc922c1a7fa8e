-- CreateJob's idempotency key: a retried create returns the job the first one created.
ALTER TABLE jobs ADD COLUMN create_key text;
CREATE UNIQUE INDEX jobs_create_key_idx ON jobs (account_id, create_key) WHERE create_key IS NOT NULL;

-- Which dispatcher moved a run to starting: when that dispatcher stops heartbeating (its row in
-- dispatchers goes stale) the scheduler loop reclaims its starting runs at once, instead of after
-- the start timeout. NULL: not recorded (the run is reclaimed by the start timeout only).
ALTER TABLE runs ADD COLUMN dispatcher_id text;
