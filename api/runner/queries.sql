-- The runner API: every statement is a compare-and-set on the run's token and lease.

-- name: claimed_run
-- What the runner is told: the run with its job and account, for the holder of the lease.
SELECT r.id, r.account_id, r.job_id, r.job_type, r.trigger, r.cause, r.trace_parent, r.overrides, r.schema_name,
       r.pull_request_number, r.cancel_requested_at, j.steps, j.environment, j.secret_environment, j.threads,
       j.timeout_seconds, j.target_name, j.git_branch, j.generate_docs, j.run_source_freshness, j.run_only_modified,
       a.memory_mb, a.cpu_weight, a.cpu_max
  FROM runs r JOIN jobs j ON j.id = r.job_id JOIN accounts a ON a.id = r.account_id
 WHERE r.id = %(run_id)s AND r.status = 3 AND r.lease_owner = %(lease_id)s AND r.runner_token_hash = %(token_hash)s

-- name: create_steps
INSERT INTO run_steps (run_id, step_index, command, optional, setup)
SELECT %(run_id)s, i - 1, c, (i - 1) = ANY(%(optional)b::int[]), i <= %(setup)s
  FROM unnest(%(commands)b::text[]) WITH ORDINALITY AS s(c, i)
ON CONFLICT (run_id, step_index) DO NOTHING

-- name: run_access
-- Why a call was refused (or, locked, that it may go on): the token, the status and the lease.
SELECT status, lease_owner, runner_token_hash = %(token_hash)s AS token_ok,
       cancel_requested_at IS NOT NULL AS cancel_requested, account_id
  FROM runs WHERE id = %(run_id)s

-- name: lock_lease
-- Held until the write commits: a reaper or a second runner waits, then finds the write done.
SELECT cancel_requested_at IS NOT NULL AS cancel_requested,
       (SELECT count(*) FROM run_steps s WHERE s.run_id = r.id) AS step_count
  FROM runs r
 WHERE id = %(run_id)s AND status = 3 AND lease_owner = %(lease_id)s AND runner_token_hash = %(token_hash)s
   FOR SHARE

-- name: renew_lease
UPDATE runs
   SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       heartbeat_at = clock_timestamp()
 WHERE id = %(run_id)s AND status = 3 AND lease_owner = %(lease_id)s AND runner_token_hash = %(token_hash)s
RETURNING cancel_requested_at IS NOT NULL AS cancel_requested

-- name: insert_log_chunks
-- A seq already stored is a retry of a call that took effect: skipped.
INSERT INTO run_log_chunks (run_id, seq, step_index, text)
SELECT %(run_id)s, s, i, t FROM unnest(%(seqs)b::bigint[], %(step_indexes)b::int[], %(texts)b::text[]) AS v(s, i, t)
ON CONFLICT (run_id, seq) DO NOTHING

-- name: step_of_run
SELECT status, exit_code, started_at IS NOT NULL AS started FROM run_steps
 WHERE run_id = %(run_id)s AND step_index = %(step_index)s

-- name: step_started
-- Only a queued step whose predecessors have all ended may start.
UPDATE run_steps s SET status = 3, started_at = clock_timestamp()
 WHERE s.run_id = %(run_id)s AND s.step_index = %(step_index)s AND s.status = 1
   AND NOT EXISTS (SELECT 1 FROM run_steps e
                    WHERE e.run_id = s.run_id AND e.step_index < s.step_index AND e.status IN (1, 3))
RETURNING s.step_index

-- name: step_finished
UPDATE run_steps SET status = %(status)s, exit_code = %(exit_code)s, end_reason = %(end_reason)s,
                     finished_at = clock_timestamp()
 WHERE run_id = %(run_id)s AND step_index = %(step_index)s AND status = 3
RETURNING step_index

-- name: steps_skipped
-- Never started: an earlier step failed, preparing the run failed, or the run was cancelled.
UPDATE run_steps SET skipped = true WHERE run_id = %(run_id)s AND step_index >= %(from_index)s AND started_at IS NULL

-- name: upsert_artifact
INSERT INTO artifacts (run_id, path, step_index, content)
VALUES (%(run_id)s, %(path)s, %(step_index)s, %(content)s)
ON CONFLICT (run_id, path, step_index) DO UPDATE SET content = EXCLUDED.content, created_at = now()

-- name: record_deferral
-- At the first claim of a run whose job defers: the run it starts from (the latest successful run
-- with a manifest.json of the job it defers to, or of a deploy job of the environment it defers
-- to), recorded on the run, and that manifest added to the run's state files.
UPDATE runs r
   SET deferring_run_id = d.id,
       overrides = jsonb_set(
           r.overrides || '{"defer": true}'::jsonb, '{state_files}',
           coalesce(r.overrides -> 'state_files', '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
               'source_run_id', d.id, 'step_index', d.step_index, 'path', 'target/manifest.json', 'dest', %(dest)s::text)))
  FROM jobs j
  CROSS JOIN LATERAL (
      SELECT s.id, m.step_index
        FROM runs s
        JOIN jobs sj ON sj.id = s.job_id
        CROSS JOIN LATERAL (SELECT max(a.step_index) AS step_index FROM artifacts a
                             WHERE a.run_id = s.id AND a.path = 'target/manifest.json') AS m
       WHERE s.account_id = j.account_id AND s.status = 10 AND m.step_index IS NOT NULL
         AND (s.job_id = j.defer_to_job_id OR (sj.environment_id = j.defer_to_environment_id AND sj.job_type = 'deploy'))
       ORDER BY s.id DESC
       LIMIT 1
  ) AS d
 WHERE r.id = %(run_id)s AND j.id = r.job_id AND r.deferring_run_id IS NULL
   AND (j.defer_to_job_id IS NOT NULL OR j.defer_to_environment_id IS NOT NULL)

-- name: state_file
-- The run's state file at index (overrides.state_files, written by the control plane), read from
-- the artifacts of its source run, which must belong to the same account.
SELECT a.content
  FROM runs r
 CROSS JOIN LATERAL (SELECT r.overrides -> 'state_files' -> %(index)s::int AS f) AS s
  JOIN runs src ON src.id = (s.f ->> 'source_run_id')::bigint AND src.account_id = r.account_id
  JOIN artifacts a ON a.run_id = src.id AND a.path = s.f ->> 'path' AND a.step_index = (s.f ->> 'step_index')::int
 WHERE r.id = %(run_id)s

-- name: record_git_sha
UPDATE runs SET git_sha = %(git_sha)s WHERE id = %(run_id)s

-- What a run of a job with an environment needs to run dbt (runplane/dbt/context.py).
-- name: dbt_context
SELECT r.id AS run_id, r.job_id, r.account_id, r.job_type, r.trigger, r.cause, r.overrides,
       r.schema_name AS run_schema, r.pull_request_number,
       j.schema_name AS job_schema, j.target_name AS job_target_name, j.threads AS job_threads,
       j.git_branch AS job_git_branch,
       e.id AS environment_id, e.environment_type, e.dbt_version, e.git_branch AS environment_git_branch,
       e.adapter_type, e.connection, e.connection_secrets, e.target_name AS environment_target_name,
       e.schema_name AS environment_schema, e.threads AS environment_threads,
       -- The project's defaults (environment-variables API) under the environment's own values.
       (SELECT coalesce(jsonb_object_agg(pv.name, pv.value), '{}'::jsonb) FROM project_variables pv
         WHERE pv.project_id = p.id AND NOT pv.secret) || e.variables AS variables,
       (SELECT coalesce(jsonb_object_agg(pv.name, pv.value), '{}'::jsonb) FROM project_variables pv
         WHERE pv.project_id = p.id AND pv.secret) || e.secret_variables AS secret_variables,
       p.id AS project_id, p.repository_url, p.subdirectory, p.git_credential_kind, p.git_credential
  FROM runs r
  JOIN jobs j ON j.id = r.job_id
  JOIN environments e ON e.id = j.environment_id
  JOIN projects p ON p.id = e.project_id
 WHERE r.id = %(run_id)s

-- Warm pool Pods (WaitForRun): the Pod's own token names its row until a run is handed to it.

-- name: pool_runner_waiting
-- The row of an unspent pool token, and the run a dispatcher gave it (if one did).
SELECT name, run_id FROM pool_runners WHERE token_hash = %(token_hash)s AND handed_at IS NULL

-- name: pool_runner_seen
-- Its heartbeat: a Pod that stops calling is replaced (and no run is given to it meanwhile).
UPDATE pool_runners SET seen_at = clock_timestamp() WHERE name = %(name)s AND handed_at IS NULL

-- name: hand_run_to_pool_runner
-- The Pod's token is spent, and the run's new token replaces the one its dispatcher issued, while
-- the run is still starting in the launch it was given for: a run relaunched elsewhere meanwhile
-- is not taken. The Pod's token is spent either way (one run per Pod).
WITH spent AS (
    UPDATE pool_runners SET handed_at = clock_timestamp()
     WHERE name = %(name)s AND handed_at IS NULL
    RETURNING run_id, run_attempt
)
UPDATE runs r SET runner_token_hash = %(run_token_hash)s
  FROM spent
 WHERE r.id = spent.run_id AND r.launch_attempts = spent.run_attempt AND r.status = 2
RETURNING r.id
