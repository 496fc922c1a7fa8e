-- name: queue_runs
-- One statement per tick: insert the due cron runs (Postgres re-checked: deleted or deactivated jobs
-- queue nothing), then cancel older cron runs of the same jobs that are still queued. The UPDATE
-- reads the snapshot from before the INSERT, so it only ever sees the older runs.
WITH due AS (
    SELECT * FROM unnest(%(job_ids)s::bigint[], %(fire_ts)s::bigint[], %(keys)s::text[]) AS d (job_id, fire_ts, key)
), inserted AS (
    INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, priority, takes_slot, scheduled_at)
    SELECT j.account_id, j.id, j.job_type, 'schedule', d.key, j.priority, j.job_type <> 'ci', to_timestamp(d.fire_ts)
    FROM due d JOIN jobs j ON j.id = d.job_id
    WHERE j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.cron IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, account_id, scheduled_at, queued_at
), superseded AS (
    UPDATE runs r
    SET status = 30, finished_at = now(), status_message = %(superseded_message)s
    FROM inserted i
    WHERE r.job_id = i.job_id AND r.status = 1 AND r.trigger = 'schedule' AND r.scheduled_at < i.scheduled_at
    RETURNING r.id
)
SELECT i.account_id,
       extract(epoch FROM i.queued_at - i.scheduled_at)::float8 AS trigger_lag,
       (SELECT count(*) FROM superseded) AS superseded
FROM inserted i;
