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
