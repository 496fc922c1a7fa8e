-- The history of each job's schedule: which cron and time zone were in force from when, and whether
-- the job could fire then (not paused, deactivated or deleted, and with a cron). A cron run is queued
-- only for an instant whose schedule in force is the one the queuer worker computed it from, so a
-- stale heap (a worker frozen while the job was edited or paused), a late catch-up or a delayed
-- Assign can never make a run the schedule did not allow (runplane/runs/transitions.sql, queue_runs).
--
-- Written by a trigger, so no door can change a schedule without its history (a week of it). A change takes
-- effect at its transaction's time (now()). A job's first schedule stands from -infinity: a new
-- job fires only after the orchestrator assigned it (its fires_after), never for an instant
-- before it was made.
CREATE TABLE job_schedules (
    job_id     bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    valid_from timestamptz NOT NULL,
    cron       text,
    timezone   text NOT NULL,
    fires      boolean NOT NULL,
    PRIMARY KEY (job_id, valid_from)
);

CREATE FUNCTION job_fires(j jobs) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.cron IS NOT NULL
$$;

CREATE FUNCTION record_job_schedule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.cron IS NOT DISTINCT FROM NEW.cron AND OLD.timezone = NEW.timezone
       AND job_fires(OLD) = job_fires(NEW) THEN
        RETURN NULL;
    END IF;
    -- A week of history is kept (the schedule in force a week ago, and every change since): no fire
    -- older than that is queued.
    DELETE FROM job_schedules s
     WHERE s.job_id = NEW.id
       AND s.valid_from < (SELECT max(o.valid_from) FROM job_schedules o
                            WHERE o.job_id = NEW.id AND o.valid_from <= now() - interval '7 days');
    INSERT INTO job_schedules (job_id, valid_from, cron, timezone, fires)
    VALUES (NEW.id, CASE WHEN TG_OP = 'INSERT' THEN '-infinity'::timestamptz ELSE now() END,
            NEW.cron, NEW.timezone, job_fires(NEW))
    ON CONFLICT (job_id, valid_from) DO UPDATE
        SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, fires = EXCLUDED.fires;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_schedule_history
    AFTER INSERT OR UPDATE OF cron, timezone, paused_at, deactivated_at, deleted_at ON jobs
    FOR EACH ROW EXECUTE FUNCTION record_job_schedule();

INSERT INTO job_schedules (job_id, valid_from, cron, timezone, fires)
SELECT j.id, '-infinity', j.cron, j.timezone, job_fires(j) FROM jobs j;
