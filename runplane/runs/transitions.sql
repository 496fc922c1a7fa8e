-- A run's status transitions (runplane/runs/). Every statement runs inside one transaction.

-- name: finish_run
-- Compare-and-set from a non-terminal status; with a lease owner, only that runner may end it;
-- with require_lease_expired, only while the lease is still expired (a late heartbeat wins).
UPDATE runs
   SET status = %(status)s,
       status_message = %(message)s,
       finished_at = clock_timestamp(),
       waiting_reason = '',
       not_before = NULL
 WHERE id = %(run_id)s
   AND status = ANY(%(from_statuses)s)
   AND (%(lease_owner)s::text IS NULL OR lease_owner = %(lease_owner)s)
   AND (NOT %(require_lease_expired)s OR lease_expires_at < clock_timestamp())
RETURNING id, account_id, job_id, job_type, trigger, cause, attempt, priority, takes_slot, overrides,
          pull_request_number, schema_name

-- name: end_unfinished_steps
UPDATE run_steps
   SET status = CASE WHEN started_at IS NULL THEN status ELSE %(status)s END,
       skipped = started_at IS NULL,
       end_reason = CASE WHEN started_at IS NULL THEN end_reason ELSE %(reason)s END,
       finished_at = CASE WHEN started_at IS NULL THEN NULL ELSE clock_timestamp() END
 WHERE run_id = %(run_id)s AND finished_at IS NULL AND NOT skipped

-- name: reset_failures
UPDATE jobs SET consecutive_failures = 0 WHERE id = %(job_id)s AND consecutive_failures <> 0

-- name: count_failure
-- At the limit the job is deactivated; the version bump tells the orchestrator to stop queuing it.
UPDATE jobs
   SET consecutive_failures = consecutive_failures + 1,
       deactivated_at = CASE WHEN reaches THEN now() ELSE deactivated_at END,
       deactivation_reason = CASE WHEN reaches THEN %(reason)s ELSE deactivation_reason END,
       version = CASE WHEN reaches THEN version + 1 ELSE version END,
       updated_at = CASE WHEN reaches THEN now() ELSE updated_at END
  FROM (SELECT consecutive_failures + 1 >= %(limit)s AND deactivated_at IS NULL AS reaches
          FROM jobs WHERE id = %(job_id)s) AS d
 WHERE jobs.id = %(job_id)s
RETURNING d.reaches AS deactivated_now, jobs.deactivated_at, jobs.deleted_at, jobs.retry_max_attempts,
          jobs.retry_on_step_failure

-- name: job_retry_policy
SELECT deactivated_at, deleted_at, retry_max_attempts, retry_on_step_failure FROM jobs WHERE id = %(job_id)s

-- name: mark_retries_exhausted
UPDATE runs SET retries_exhausted = true, status_message = %(message)s WHERE id = %(run_id)s

-- name: queue_retry
INSERT INTO runs (account_id, job_id, job_type, trigger, cause, idempotency_key, attempt, parent_run_id,
                  priority, takes_slot, overrides, pull_request_number, schema_name, scheduled_at)
VALUES (%(account_id)s, %(job_id)s, %(job_type)s, 'retry', %(cause)s, %(idempotency_key)s, %(attempt)s,
        %(parent_run_id)s, %(priority)s, %(takes_slot)s, %(overrides)s, %(pull_request_number)s,
        %(schema_name)s, clock_timestamp() + make_interval(secs => %(delay)s))
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id

-- name: queue_completion_triggers
-- One run per downstream job and upstream run: the key is runplane.types.completion_idempotency_key.
INSERT INTO runs (account_id, job_id, job_type, trigger, cause, idempotency_key, upstream_run_id,
                  priority, takes_slot, scheduled_at)
SELECT j.account_id, j.id, j.job_type, 'completion',
       'completion of run ' || %(run_id)s::bigint || ' of job ' || %(upstream_job_id)s::bigint,
       'done:' || %(run_id)s::bigint || ':' || j.id,
       %(run_id)s, j.priority, j.job_type <> 'ci', clock_timestamp()
  FROM job_completion_triggers t
  JOIN jobs j ON j.id = t.job_id
 WHERE t.upstream_job_id = %(upstream_job_id)s
   AND %(status)s::smallint = ANY(t.statuses)
   AND j.deactivated_at IS NULL
   AND j.deleted_at IS NULL
ORDER BY j.id
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, account_id

-- name: requeue_for_relaunch
-- Back to queued after a failed or lost launch; launch_attempts keeps counting.
UPDATE runs
   SET status = 1,
       dispatched_at = NULL,
       pod_name = '',
       not_before = clock_timestamp() + make_interval(secs => %(delay)s),
       waiting_reason = 'launch_backoff',
       status_message = %(message)s
 WHERE id = %(run_id)s AND status = 2 AND launch_attempts = %(launch_attempts)s
RETURNING id

-- name: count_pod_launch
UPDATE runs SET launch_attempts = %(launch_attempts)s WHERE id = %(run_id)s

-- name: requeue_after_pod_failure
-- The runner never claimed the run: back to queued, launched again after the backoff.
UPDATE runs
   SET status = 1,
       launch_attempts = %(launch_attempts)s,
       not_before = clock_timestamp() + make_interval(secs => %(delay)s),
       waiting_reason = 'launch_backoff',
       status_message = 'pod failed before the runner started, relaunching: ' || %(reason)s,
       pod_name = '',
       dispatched_at = NULL
 WHERE id = %(run_id)s AND status = 2
