-- name: queue_runs
-- One statement per tick: insert the due cron runs. Postgres is re-checked: deleted or deactivated
-- jobs queue nothing. A fire queued before (by this or another worker) is skipped by its key.
INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, priority, takes_slot, scheduled_at)
SELECT j.account_id, j.id, j.job_type, 'schedule', d.key, j.priority, j.job_type <> 'ci', to_timestamp(d.fire_ts)
FROM unnest(%(job_ids)s::bigint[], %(fire_ts)s::bigint[], %(keys)s::text[]) AS d (job_id, fire_ts, key)
JOIN jobs j ON j.id = d.job_id
WHERE j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.cron IS NOT NULL
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING account_id, job_id, extract(epoch FROM scheduled_at)::bigint AS fire_ts,
          extract(epoch FROM queued_at - scheduled_at)::float8 AS trigger_lag;

-- name: cancel_superseded
-- Same transaction, right after: older cron runs of the jobs just queued that are still queued are
-- superseded (one queued cron run per job). Each cancellation says why the older run was still
-- waiting, read from the state right now:
--   job_running  the job's previous run is running with a live lease: the job is over-scheduled;
--   no_slot      every run slot of the account is taken by a running run or a fresh start;
--   behind       neither: runplane itself did not dispatch it in time (a dead dispatcher's stale
--                starts, a backlog) - no advice to the user, counted for operators.
-- Runs of other triggers are never touched. (Run with nested loops off: on a table whose statistics
-- lag a burst, a nested loop would rescan the index once per queued run.)
WITH waiting AS (
    SELECT r.id,
           CASE
             WHEN EXISTS (SELECT 1 FROM runs o WHERE o.job_id = r.job_id AND o.status = 3
                            AND o.lease_expires_at > clock_timestamp()) THEN 'job_running'
             WHEN r.takes_slot AND (
                    SELECT count(*) FROM runs o WHERE o.account_id = r.account_id AND o.takes_slot AND (
                        (o.status = 3 AND o.lease_expires_at > clock_timestamp())
                        OR (o.status = 2 AND o.dispatched_at > clock_timestamp() - make_interval(secs => %(fresh_start)s)))
                  ) >= (SELECT a.run_slots FROM accounts a WHERE a.id = r.account_id) THEN 'no_slot'
             ELSE 'behind'
           END AS reason
    FROM runs r
    JOIN unnest(%(job_ids)s::bigint[], %(fire_ts)s::bigint[]) AS d (job_id, fire_ts)
      ON r.job_id = d.job_id AND r.scheduled_at < to_timestamp(d.fire_ts)
    WHERE r.status = 1 AND r.trigger = 'schedule'
    FOR UPDATE OF r
)
UPDATE runs r
SET status = 30, finished_at = now(), waiting_reason = '',
    status_message = CASE w.reason WHEN 'job_running' THEN %(job_running)s
                                   WHEN 'no_slot' THEN %(no_slot)s ELSE %(behind)s END
FROM waiting w
WHERE r.id = w.id AND r.status = 1
RETURNING w.reason;

-- name: deactivate_never_fires
-- A schedule with no next fire is that job's error: deactivate it with the reason (GetJob shows it);
-- the version bump tells the orchestrator to revoke it. Only the version the worker held is touched,
-- so a definition saved meanwhile (which may fix the schedule) wins.
UPDATE jobs
   SET deactivated_at = now(), deactivation_reason = %(reason)s, version = version + 1, updated_at = now()
 WHERE id = %(job_id)s AND version = %(version)s AND deleted_at IS NULL AND deactivated_at IS NULL
