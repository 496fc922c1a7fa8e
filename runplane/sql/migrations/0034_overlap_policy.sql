-- What a cron fire of a job does while a run of the job is still queued or running (DESIGN.md,
-- "Overlap policies"). Every existing job keeps today's behaviour: serial.
ALTER TABLE jobs ADD COLUMN overlap_policy text NOT NULL DEFAULT 'serial'
    CHECK (overlap_policy IN ('serial', 'skip', 'buffer_one', 'buffer_all', 'cancel_other', 'allow_all'));

-- A job's fires come its own fixed offset later, in [0, jitter_seconds] (runplane.basics.jitter):
-- the same offset every time, so a top-of-the-hour crowd of jobs spreads out. 0: no offset.
ALTER TABLE jobs ADD COLUMN jitter_seconds integer NOT NULL DEFAULT 0
    CHECK (jitter_seconds BETWEEN 0 AND 3600);

-- Who paused the job and why (empty while it is not paused).
ALTER TABLE jobs ADD COLUMN paused_by text NOT NULL DEFAULT '' CHECK (length(paused_by) <= 200);
ALTER TABLE jobs ADD COLUMN pause_note text NOT NULL DEFAULT '' CHECK (length(pause_note) <= 1000);

-- A cron occurrence that got no run, and why. The key is the idempotency key its run would have had
-- (sched:{job_id}:{unix_ts}): an occurrence has a run or a skipped record, never both, and a fire
-- retried after it was skipped stays skipped. Reasons: overlap (the job's overlap policy); a later
-- feature that gives up on an occurrence (a catch-up window) records its own reason here.
CREATE TABLE skipped_occurrences (
    id              bigserial PRIMARY KEY,
    account_id      bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    job_id          bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    occurrence_key  text NOT NULL UNIQUE,
    scheduled_at    timestamptz NOT NULL,           -- the occurrence's time
    reason          text NOT NULL CHECK (reason <> ''),
    detail          text NOT NULL DEFAULT '',       -- shown to the user
    blocking_run_id bigint,                         -- overlap: the run of the job that was in the way
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX skipped_occurrences_job_idx ON skipped_occurrences (job_id, scheduled_at DESC);
CREATE INDEX skipped_occurrences_recorded_idx ON skipped_occurrences (recorded_at);

-- The runs of a job still in progress: what a fire's overlap policy and a reattaching trigger look at.
CREATE INDEX runs_job_in_progress_idx ON runs (job_id, id) WHERE status IN (1, 2, 3);
