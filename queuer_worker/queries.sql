-- A queuer worker's own statements (a run's transitions are in runplane/runs/transitions.sql).

-- name: deactivate_never_fires
-- A schedule with no next fire is that job's error: deactivate it with the reason (GetJob shows it);
-- the version bump tells the orchestrator to revoke it. Only the version the worker held is touched,
-- so a definition saved meanwhile (which may fix the schedule) wins.
UPDATE jobs
   SET deactivated_at = now(), deactivation_reason = %(reason)s, version = version + 1, updated_at = now()
 WHERE id = %(job_id)s AND version = %(version)s AND deleted_at IS NULL AND deactivated_at IS NULL

-- name: worker_state
-- Whether the leader has declared this worker dead ('dead'), checked after the worker stood still.
SELECT state FROM queuer_workers WHERE worker_id = %(worker_id)s

-- name: record_missed
-- Fires a new owner of their jobs gives up (older than the grace and the catch-up window, or older
-- than the one catch-up run): each recorded as a skipped occurrence, reason 'missed', under the key its
-- run would have had, only when it has no run and was an occurrence of the schedule in force then
-- (as queue_runs decides) at or after the job was made. A job no longer schedulable records nothing.
INSERT INTO skipped_occurrences (account_id, job_id, occurrence_key, scheduled_at, reason, detail)
SELECT j.account_id, d.job_id, d.key, to_timestamp(d.fire_ts), 'missed', d.detail
FROM unnest(%(job_ids)b::bigint[], %(fire_ts)b::bigint[], %(keys)b::text[], %(crons)b::text[],
            %(timezones)b::text[], %(details)b::text[])
     AS d (job_id, fire_ts, key, cron, timezone, detail)
JOIN jobs j ON j.id = d.job_id
CROSS JOIN LATERAL (
    SELECT s.fires, s.cron, s.timezone FROM job_schedules s
     WHERE s.job_id = d.job_id AND s.valid_from <= to_timestamp(d.fire_ts)
     ORDER BY s.valid_from DESC LIMIT 1
) AS in_force
WHERE j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.cron IS NOT NULL
  AND j.created_at <= to_timestamp(d.fire_ts)
  AND in_force.fires AND in_force.cron = d.cron AND in_force.timezone = d.timezone
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.idempotency_key = d.key)
ON CONFLICT (occurrence_key) DO NOTHING
RETURNING job_id
