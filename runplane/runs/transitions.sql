-- Every status transition of a run, one named statement each (runplane/runs/transitions.py loads
-- them for every part). Statuses: queued 1, starting 2, running 3, success 10, error 20, cancelled 30.
-- Each change of status is a compare-and-set on the status it leaves.

-- Queuing: a new run (status queued).

-- name: insert_run
-- run_at (NULL: now) is when the run is due: dispatch takes only due runs (scheduled_at), and a run
-- at a later time enters the queue (queued_at) then, so its wait is counted from then.
INSERT INTO runs (
    account_id, job_id, job_type, trigger, cause, idempotency_key, priority, takes_slot, overrides,
    pull_request_number, schema_name, trace_parent, parent_run_id, job_paused, scheduled_at, queued_at,
    trigger_fingerprint
) VALUES (
    %(account_id)s, %(job_id)s, %(job_type)s, %(trigger)s, %(cause)s, %(idempotency_key)s, %(priority)s,
    %(takes_slot)s, %(overrides)s, %(pull_request_number)s, %(schema_name)s, %(trace_parent)s, %(parent_run_id)s,
    %(job_paused)s, COALESCE(%(run_at)s, now()), GREATEST(now(), %(run_at)s), %(trigger_fingerprint)s
)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *

-- name: queue_runs
-- One statement per tick: insert the due cron runs. Postgres decides whether each occurrence exists:
-- the schedule in force at the fire's instant (job_schedules) must let the job fire then and be the
-- very cron and time zone the worker computed the fire from, so a stale heap or a late catch-up
-- queues nothing the schedule did not allow; and the job must still be schedulable now (deleted,
-- deactivated or paused jobs queue nothing). A fire queued before (by this or another worker) is
-- skipped by its key, and so is one recorded as skipped before. A jittered fire's run is due (scheduled_at)
-- its job's offset after the occurrence's instant; the occurrence stays the instant (its key).
-- The job's overlap policy decides an occurrence that meets a run of the job in progress (DESIGN.md,
-- "Overlap policies"): skip makes no run while one is queued, starting or running; buffer_one none
-- while one is queued; either way the occurrence is recorded in skipped_occurrences, under the same
-- key, with the run that was in the way. Of two fires of one such job in one tick, the later one is
-- skipped. (The caller locks those jobs' rows first: two workers firing one occurrence decide it
-- one after the other, so it ends with a run or a skipped record, never both.)
WITH due AS (
    SELECT d.job_id, d.fire_ts, d.offset_s, d.key, j.account_id, j.job_type, j.priority, j.overlap_policy,
           row_number() OVER (PARTITION BY d.job_id ORDER BY d.fire_ts) AS nth
    FROM unnest(%(job_ids)b::bigint[], %(fire_ts)b::bigint[], %(keys)b::text[], %(crons)b::text[], %(timezones)b::text[],
                %(offsets)b::int[])
         AS d (job_id, fire_ts, key, cron, timezone, offset_s)
    JOIN jobs j ON j.id = d.job_id
    CROSS JOIN LATERAL (
        SELECT s.fires, s.cron, s.timezone FROM job_schedules s
         WHERE s.job_id = d.job_id AND s.valid_from <= to_timestamp(d.fire_ts)
         ORDER BY s.valid_from DESC LIMIT 1
    ) AS in_force
    WHERE j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.cron IS NOT NULL
      AND in_force.fires AND in_force.cron = d.cron AND in_force.timezone = d.timezone
      AND NOT EXISTS (SELECT 1 FROM skipped_occurrences k WHERE k.occurrence_key = d.key)
), decided AS (
    SELECT due.*, in_the_way.id AS blocking_run_id,
           due.overlap_policy IN ('skip', 'buffer_one') AND (in_the_way.id IS NOT NULL OR due.nth > 1) AS skip
    FROM due
    LEFT JOIN LATERAL (
        SELECT r.id FROM runs r
         WHERE due.overlap_policy IN ('skip', 'buffer_one')
           AND r.job_id = due.job_id AND r.status IN (1, 2, 3) AND r.idempotency_key <> due.key
           AND (r.status = 1 OR due.overlap_policy = 'skip')
         ORDER BY r.id LIMIT 1
    ) AS in_the_way ON true
), skipped AS (
    INSERT INTO skipped_occurrences (account_id, job_id, occurrence_key, scheduled_at, reason, detail, blocking_run_id)
    SELECT account_id, job_id, key, to_timestamp(fire_ts), 'overlap',
           CASE WHEN blocking_run_id IS NULL THEN %(overlap_same_tick)s
                WHEN overlap_policy = 'skip' THEN %(overlap_skip)s || blocking_run_id
                ELSE %(overlap_buffer_one)s || blocking_run_id END,
           blocking_run_id
      FROM decided
     WHERE skip AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.idempotency_key = decided.key)
    ON CONFLICT (occurrence_key) DO NOTHING
    RETURNING account_id, job_id, extract(epoch FROM scheduled_at)::bigint AS fire_ts
), queued AS (
    INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, priority, takes_slot, scheduled_at)
    SELECT account_id, job_id, job_type, 'schedule', key, priority, job_type <> 'ci',
           to_timestamp(fire_ts + coalesce(offset_s, 0))
      FROM decided
     WHERE NOT skip
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, account_id, job_id, extract(epoch FROM scheduled_at)::bigint AS fire_ts,
              extract(epoch FROM queued_at - scheduled_at)::float8 AS trigger_lag
)
SELECT q.id AS run_id, q.account_id, q.job_id, q.fire_ts, q.trigger_lag, j.overlap_policy, false AS skipped
  FROM queued q JOIN jobs j ON j.id = q.job_id
UNION ALL
SELECT NULL, s.account_id, s.job_id, s.fire_ts, 0, 'skip', true FROM skipped s

-- name: lock_overlap_jobs
-- Before queue_runs, in the same transaction: the rows of the tick's jobs whose policy decides a
-- fire by the runs in progress (skip, buffer_one), in id order so two workers never deadlock.
SELECT id FROM jobs
 WHERE id = ANY(%(job_ids)b::bigint[]) AND overlap_policy IN ('skip', 'buffer_one')
 ORDER BY id
   FOR NO KEY UPDATE

-- name: cancel_overlapped
-- Same transaction, right after queue_runs: a new cron run of a cancel_other job cancels the job's
-- runs still in progress (any trigger): a queued one now; a starting or running one is asked to stop
-- and ends cancelled with the reason (runs.cancel_reason, read by finish_run). The new run waits
-- for them, serially, like any run of its job.
UPDATE runs r
   SET status = CASE WHEN r.status = 1 THEN 30 ELSE r.status END,
       finished_at = CASE WHEN r.status = 1 THEN now() ELSE r.finished_at END,
       waiting_reason = CASE WHEN r.status = 1 THEN '' ELSE r.waiting_reason END,
       status_message = CASE WHEN r.status = 1 THEN %(message)s || d.run_id ELSE r.status_message END,
       cancel_reason = %(message)s || d.run_id,
       cancel_requested_at = COALESCE(r.cancel_requested_at, now())
  FROM unnest(%(job_ids)b::bigint[], %(run_ids)b::bigint[]) AS d (job_id, run_id)
 WHERE r.job_id = d.job_id AND r.status IN (1, 2, 3) AND r.id < d.run_id
RETURNING r.id, r.status

-- queued → starting → running.

-- name: start_runs
-- Compare-and-set queued → starting: a run another dispatcher already took is left alone.
-- Each start issues the run a new token (only its hash is kept); any earlier token is dead.
UPDATE runs r
   SET status = 2,
       runner_token_hash = v.token_hash,
       dispatched_at = clock_timestamp(),
       waiting_reason = '',
       not_before = NULL,
       launch_attempts = r.launch_attempts + 1,
       schema_name = v.schema_name,
       cluster = %(cluster)s,
       dispatcher_id = nullif(%(dispatcher_id)s, '')
  FROM unnest(%(ids)b::bigint[], %(schemas)b::text[], %(token_hashes)b::bytea[]) AS v(id, schema_name, token_hash)
 WHERE r.id = v.id AND r.status = 1
RETURNING r.id, r.job_id, r.launch_attempts, r.overrides, r.trace_parent,
          (SELECT timeout_seconds FROM jobs j WHERE j.id = r.job_id) AS timeout_seconds,
          coalesce(nullif(r.overrides->>'dbt_version', ''), nullif(r.overrides->>'dbtVersion', ''),
                   (SELECT e.dbt_version FROM jobs j JOIN environments e ON e.id = j.environment_id
                     WHERE j.id = r.job_id)) AS dbt_version

-- name: claim_run
-- Compare-and-set starting → running for the holder of the run's token (through the runner API);
-- the lease id is the runner's. A duplicate runner, or another run's token, finds nothing.
UPDATE runs r
   SET status = 3,
       started_at = clock_timestamp(),
       lease_owner = %(lease_id)s,
       lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       heartbeat_at = clock_timestamp(),
       waiting_reason = ''
  FROM jobs j, accounts a
 WHERE r.id = %(run_id)s AND r.status = 2 AND r.runner_token_hash = %(token_hash)s
   AND j.id = r.job_id AND a.id = r.account_id
RETURNING r.id

-- Cancelling queued runs.

-- name: cancel_queued_run
-- Compare-and-set: only a run still queued is cancelled here; a dispatcher may have taken it.
UPDATE runs SET status = 30, finished_at = now(), waiting_reason = '', status_message = %(message)s,
    cancel_requested_at = COALESCE(cancel_requested_at, now())
WHERE id = %(run_id)s AND account_id = %(account_id)s AND status = 1
RETURNING *

-- name: cancel_queued_runs_of_job
UPDATE runs SET status = 30, finished_at = now(), waiting_reason = '', status_message = %(message)s
WHERE job_id = %(job_id)s AND status = 1

-- name: supersede_ci_runs
-- (runplane/runs/pull_requests.py) A new CI run of a pull request supersedes the job's older CI runs of that pull request still in
-- progress: a queued one is cancelled now; a starting or running one is asked to stop and ends
-- cancelled with the reason (runs.cancel_reason, read by finish_run).
UPDATE runs
   SET status = CASE WHEN status = 1 THEN 30 ELSE status END,
       finished_at = CASE WHEN status = 1 THEN now() ELSE finished_at END,
       waiting_reason = CASE WHEN status = 1 THEN '' ELSE waiting_reason END,
       status_message = CASE WHEN status = 1 THEN %(message)s ELSE status_message END,
       cancel_reason = %(message)s,
       cancel_requested_at = COALESCE(cancel_requested_at, now())
 WHERE job_id = %(job_id)s AND pull_request_number = %(pull_request_number)s AND job_type = 'ci'
   AND status IN (1, 2, 3) AND id < %(run_id)s
RETURNING id, status

-- name: cancel_superseded
-- Same transaction, right after: older cron runs of the serial jobs just queued that are still
-- queued are superseded (one queued cron run per job; the other overlap policies decide for
-- themselves). Each cancellation says why the older run was still waiting, read from the state now:
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
    JOIN unnest(%(job_ids)b::bigint[], %(fire_ts)b::bigint[]) AS d (job_id, fire_ts)
      ON r.job_id = d.job_id AND r.scheduled_at < to_timestamp(d.fire_ts)
    WHERE r.status = 1 AND r.trigger = 'schedule'
      AND (SELECT j.overlap_policy FROM jobs j WHERE j.id = r.job_id) = 'serial'
    FOR UPDATE OF r
)
UPDATE runs r
SET status = 30, finished_at = now(), waiting_reason = '',
    status_message = CASE w.reason WHEN 'job_running' THEN %(job_running)s
                                   WHEN 'no_slot' THEN %(no_slot)s ELSE %(behind)s END
FROM waiting w
WHERE r.id = w.id AND r.status = 1
RETURNING w.reason;

-- Ending a run (finish.py, retries.py), relaunching it (relaunch.py).

-- name: noop_claim_and_finish
-- The noop launcher of the benchmarks (dispatcher/noop_launcher.py): a batch of starting runs is
-- claimed and ended in success at once, with no runner, steps or lease, one statement per batch
-- where finish_run takes one per run. A success is never retried and fails no job; of what
-- finish_run does after one, it writes the job's failure count and leaves out completion triggers
-- (the benchmarks' jobs have none). Returns the accounts of the runs it ended that still have
-- queued runs: their slots are free again.
WITH finished AS (
    UPDATE runs
       SET status = 10,
           started_at = clock_timestamp(),
           finished_at = clock_timestamp(),
           status_message = 'finished by the noop launcher'
     WHERE id = ANY(%(ids)b::bigint[]) AND status = 2
    RETURNING job_id, account_id
), reset AS (
    UPDATE jobs SET consecutive_failures = 0
     WHERE id IN (SELECT job_id FROM finished) AND consecutive_failures <> 0
)
SELECT DISTINCT f.account_id
  FROM finished f
 WHERE EXISTS (SELECT 1 FROM runs r WHERE r.account_id = f.account_id AND r.status = 1)

-- name: finish_run
-- Compare-and-set from a non-terminal status; with a lease owner, only that runner may end it;
-- with require_lease_expired, only while the lease is still expired (a late heartbeat wins).
-- A run that ends cancelled after someone other than its user asked shows why (cancel_reason).
UPDATE runs
   SET status = %(status)s,
       status_message = CASE WHEN %(status)s = 30 AND cancel_reason <> '' THEN cancel_reason ELSE %(message)s END,
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
-- At the account's limit (accounts.deactivate_after_failures; 0: never) the job is deactivated; the
-- version bump tells the orchestrator to stop queuing it.
UPDATE jobs
   SET consecutive_failures = consecutive_failures + 1,
       deactivated_at = CASE WHEN reaches THEN now() ELSE deactivated_at END,
       deactivation_reason = CASE WHEN reaches
           THEN 'deactivated after ' || d.failure_limit || ' consecutive failed runs (last: run '
                || %(run_id)s::bigint || ')'
           ELSE deactivation_reason END,
       version = CASE WHEN reaches THEN version + 1 ELSE version END,
       updated_at = CASE WHEN reaches THEN now() ELSE updated_at END
  FROM (SELECT a.deactivate_after_failures AS failure_limit,
               a.deactivate_after_failures > 0 AND j.consecutive_failures + 1 >= a.deactivate_after_failures
               AND j.deactivated_at IS NULL AS reaches
          FROM jobs j JOIN accounts a ON a.id = j.account_id WHERE j.id = %(job_id)s) AS d
 WHERE jobs.id = %(job_id)s
RETURNING d.reaches AS deactivated_now, jobs.deactivated_at, jobs.deleted_at, jobs.paused_at,
          jobs.retry_max_attempts, jobs.retry_on_step_failure

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
-- One run per downstream job and upstream run: the key is runplane.basics.types.completion_idempotency_key.
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
   AND j.completion_mode = 'any'
   AND j.deactivated_at IS NULL
   AND j.paused_at IS NULL
   AND j.deleted_at IS NULL
ORDER BY j.id
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, account_id

-- name: requeue_for_relaunch
-- Back to queued after a failed or lost launch; launch_attempts keeps counting. The launch's
-- token dies with it: the next start issues a new one.
UPDATE runs
   SET status = 1,
       dispatched_at = NULL,
       runner_token_hash = NULL,
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
