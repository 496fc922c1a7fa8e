-- Every query of the API. Account scoping is part of each query: a row of another account is
-- never returned, so it looks exactly like a missing one.

-- name: account_for_token
-- Read on every call (no cache): a revoked or expired token fails at once. A token found is marked
-- used, at most once a minute.
WITH live AS (
    SELECT l.id, l.account_id, l.scopes,
           'token #' || l.id || CASE WHEN t.name <> '' THEN ' (' || t.name || ')' ELSE '' END AS who
      FROM live_api_tokens l JOIN api_tokens t ON t.id = l.id
     WHERE l.token_hash = %(token_hash)s
),
used AS (
    UPDATE api_tokens t SET last_used_at = now()
      FROM live
     WHERE t.id = live.id AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')
)
SELECT account_id, scopes, who FROM live;

-- name: insert_account
INSERT INTO accounts (name, run_slots, memory_mb)
VALUES (%(name)s, %(run_slots)s, %(memory_mb)s)
RETURNING id;

-- name: account_by_name
SELECT id FROM accounts WHERE name = %(name)s ORDER BY id LIMIT 1;

-- name: account_exists
SELECT EXISTS (SELECT 1 FROM accounts WHERE id = %(account_id)s) AS found;

-- name: insert_token
INSERT INTO api_tokens (account_id, token_hash, token_prefix, name, scopes, expires_at)
VALUES (%(account_id)s, %(token_hash)s, %(token_prefix)s, %(name)s, %(scopes)s,
        CASE WHEN %(expires_in_days)s::int IS NULL THEN NULL
             ELSE now() + make_interval(days => %(expires_in_days)s::int) END)
RETURNING id;

-- name: revoke_token
UPDATE api_tokens SET revoked_at = now()
 WHERE revoked_at IS NULL AND (id = %(token_id)s OR token_hash = %(token_hash)s)
RETURNING id, account_id;

-- name: insert_job
-- With a create key already used in this account nothing is inserted (and no row returned): the
-- caller then reads the job the first create made (job_by_create_key).
INSERT INTO jobs (
    account_id, name, job_type, steps, cron, timezone, on_pull_request, on_merge, threads,
    timeout_seconds, target_name, environment, git_branch, retry_max_attempts, retry_on_step_failure,
    missed_run_grace_seconds, priority, secret_environment, create_key, create_fingerprint, environment_id,
    schema_name, generate_docs, run_source_freshness, defer_to_job_id, defer_to_environment_id, run_only_modified,
    completion_mode, overlap_policy, jitter_seconds, kept_cron, catchup_window_seconds, catchup_all
) VALUES (
    %(account_id)s, %(name)s, %(job_type)s, %(steps)s, %(cron)s, %(timezone)s, %(on_pull_request)s,
    %(on_merge)s, %(threads)s, %(timeout_seconds)s, %(target_name)s, %(environment)s, %(git_branch)s,
    %(retry_max_attempts)s, %(retry_on_step_failure)s, %(missed_run_grace_seconds)s, %(priority)s, %(set_secrets)s,
    %(create_key)s, %(create_fingerprint)s, %(environment_id)s, %(schema_name)s, %(generate_docs)s, %(run_source_freshness)s,
    %(defer_to_job_id)s, %(defer_to_environment_id)s, %(run_only_modified)s, %(completion_mode)s,
    %(overlap_policy)s, %(jitter_seconds)s, %(kept_cron)s, %(catchup_window_seconds)s, %(catchup_all)s
)
ON CONFLICT (account_id, create_key) WHERE create_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: job_by_create_key
SELECT * FROM jobs WHERE account_id = %(account_id)s AND create_key = %(create_key)s;

-- name: get_job
-- With the project and dbt version of the job's environment (NULL without one).
SELECT jobs.*, (SELECT e.project_id FROM environments e WHERE e.id = jobs.environment_id) AS project_id,
       (SELECT e.dbt_version FROM environments e WHERE e.id = jobs.environment_id) AS dbt_version
  FROM jobs WHERE id = %(job_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: get_job_for_update
-- As get_job; only the job's row is locked.
SELECT jobs.*, (SELECT e.project_id FROM environments e WHERE e.id = jobs.environment_id) AS project_id,
       (SELECT e.dbt_version FROM environments e WHERE e.id = jobs.environment_id) AS dbt_version
  FROM jobs WHERE id = %(job_id)s AND account_id = %(account_id)s AND deleted_at IS NULL FOR UPDATE;

-- name: job_by_name
SELECT * FROM jobs
WHERE account_id = %(account_id)s AND name = %(name)s AND deleted_at IS NULL
ORDER BY id LIMIT 1;

-- name: list_jobs
SELECT * FROM jobs
WHERE account_id = %(account_id)s AND deleted_at IS NULL
  AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s)
ORDER BY id
LIMIT %(limit)s;

-- name: live_job_ids
SELECT id FROM jobs
WHERE account_id = %(account_id)s AND deleted_at IS NULL AND id = ANY(%(job_ids)b::bigint[]);

-- name: completion_creates_cycle
-- Would making job_id run on completion of upstream_ids close a loop? Follow the upstream edges.
WITH RECURSIVE upstream(id) AS (
    SELECT unnest(%(upstream_ids)b::bigint[])
    UNION
    SELECT t.upstream_job_id FROM job_completion_triggers t JOIN upstream u ON t.job_id = u.id
)
SELECT EXISTS (SELECT 1 FROM upstream WHERE id = %(job_id)s) AS cycle;

-- name: completion_triggers
SELECT job_id, upstream_job_id, statuses FROM job_completion_triggers
WHERE job_id = ANY(%(job_ids)b::bigint[])
ORDER BY job_id, upstream_job_id;

-- name: delete_completion_triggers
DELETE FROM job_completion_triggers WHERE job_id = %(job_id)s;

-- name: insert_completion_trigger
INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses)
VALUES (%(job_id)s, %(upstream_job_id)s, %(statuses)b::smallint[]);

-- name: baseline_completion_consumed
-- Only upstream runs after a trigger is saved count toward a fan-in set; a trigger kept by a save
-- keeps what it counted.
INSERT INTO completion_consumed (job_id, upstream_job_id, last_run_id)
SELECT t.job_id, t.upstream_job_id, coalesce((SELECT max(r.id) FROM runs r WHERE r.job_id = t.upstream_job_id), 0)
  FROM job_completion_triggers t
 WHERE t.job_id = %(job_id)s
ON CONFLICT (job_id, upstream_job_id) DO NOTHING;

-- name: update_job
-- Saving a job replaces its definition and reactivates it.
UPDATE jobs SET
    name = %(name)s, job_type = %(job_type)s, steps = %(steps)s, cron = %(cron)s, timezone = %(timezone)s,
    kept_cron = %(kept_cron)s,
    on_pull_request = %(on_pull_request)s, on_merge = %(on_merge)s, threads = %(threads)s,
    timeout_seconds = %(timeout_seconds)s, target_name = %(target_name)s, environment = %(environment)s,
    git_branch = %(git_branch)s, retry_max_attempts = %(retry_max_attempts)s,
    retry_on_step_failure = %(retry_on_step_failure)s, missed_run_grace_seconds = %(missed_run_grace_seconds)s,
    priority = %(priority)s, environment_id = %(environment_id)s, schema_name = %(schema_name)s,
    generate_docs = %(generate_docs)s, run_source_freshness = %(run_source_freshness)s,
    defer_to_job_id = %(defer_to_job_id)s, defer_to_environment_id = %(defer_to_environment_id)s,
    run_only_modified = %(run_only_modified)s, completion_mode = %(completion_mode)s,
    overlap_policy = %(overlap_policy)s, jitter_seconds = %(jitter_seconds)s,
    catchup_window_seconds = %(catchup_window_seconds)s, catchup_all = %(catchup_all)s,
    -- Secrets are set or unset one by one; a secret the update does not name keeps its value.
    secret_environment = (secret_environment - %(unset_secrets)b::text[]) || %(set_secrets)s,
    deactivated_at = NULL, deactivation_reason = '', consecutive_failures = 0,
    version = version + 1, updated_at = now()
WHERE id = %(job_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
RETURNING *;

-- name: delete_job
UPDATE jobs SET deleted_at = now(), version = version + 1, updated_at = now()
WHERE id = %(job_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
RETURNING id;

-- name: drop_completion_triggers_on
-- Jobs that ran on completion of a deleted job lose that trigger; their version says so.
WITH dropped AS (
    DELETE FROM job_completion_triggers WHERE upstream_job_id = %(job_id)s RETURNING job_id
)
UPDATE jobs SET version = version + 1, updated_at = now()
WHERE id IN (SELECT job_id FROM dropped) AND deleted_at IS NULL;

-- name: set_job_paused
-- Only a change of state writes: the version bump tells the orchestrator to stop (or resume) the
-- schedule, as a deactivation does. No row: the job is missing or already in that state. A pause
-- keeps who paused it and why; an unpause clears both.
UPDATE jobs SET paused_at = CASE WHEN %(paused)s THEN now() END, version = version + 1, updated_at = now(),
    paused_by = CASE WHEN %(paused)s THEN %(who)s ELSE '' END,
    pause_note = CASE WHEN %(paused)s THEN %(note)s ELSE '' END
WHERE id = %(job_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
  AND (paused_at IS NOT NULL) <> %(paused)s
RETURNING id;

-- name: reactivate_job
UPDATE jobs SET deactivated_at = NULL, deactivation_reason = '', consecutive_failures = 0,
    version = version + 1, updated_at = now()
WHERE id = %(job_id)s AND deactivated_at IS NOT NULL
RETURNING *;

-- name: run_by_idempotency_key
SELECT * FROM runs WHERE idempotency_key = %(idempotency_key)s;

-- name: get_run
-- With the environment, project and dbt version of the run's job (NULL without one).
SELECT runs.*, env.environment_id, env.project_id, env.dbt_version FROM runs
LEFT JOIN LATERAL (
    SELECT e.id AS environment_id, e.project_id, e.dbt_version
      FROM jobs j JOIN environments e ON e.id = j.environment_id WHERE j.id = runs.job_id
) env ON true
WHERE id = %(run_id)s AND account_id = %(account_id)s;

-- name: run_steps
SELECT * FROM run_steps WHERE run_id = ANY(%(run_ids)b::bigint[]) ORDER BY run_id, step_index;

-- name: list_runs
SELECT * FROM runs
WHERE account_id = %(account_id)s
  AND (%(job_id)s::bigint IS NULL OR job_id = %(job_id)s)
  AND (cardinality(%(statuses)b::smallint[]) = 0 OR status = ANY(%(statuses)b::smallint[]))
  AND (NOT %(retries_exhausted_only)s OR retries_exhausted)
  AND (%(after_id)s::bigint IS NULL OR id < %(after_id)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: request_cancel
-- A starting or running run is stopped by its runner, which watches cancel_requested_at.
UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, now())
WHERE id = %(run_id)s AND account_id = %(account_id)s AND status IN (2, 3)
RETURNING *;

-- name: run_status
SELECT status FROM runs WHERE id = %(run_id)s;

-- name: log_chunks
SELECT seq, step_index, text, created_at FROM run_log_chunks
WHERE run_id = %(run_id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s;

-- name: list_artifacts
SELECT path, step_index, octet_length(content) AS size_bytes, created_at FROM artifacts
WHERE run_id = %(run_id)s
ORDER BY path, step_index;

-- name: get_artifact
-- Without a step: the last step that wrote the file.
SELECT path, step_index, octet_length(content) AS size_bytes, created_at, content FROM artifacts
WHERE run_id = %(run_id)s AND path = %(path)s AND (%(step_index)s::int IS NULL OR step_index = %(step_index)s)
ORDER BY step_index DESC
LIMIT 1;

-- Projects and environments

-- name: insert_project
INSERT INTO projects (account_id, name, repository_url, subdirectory, git_credential_kind, git_credential)
VALUES (%(account_id)s, %(name)s, %(repository_url)s, %(subdirectory)s, %(git_credential_kind)s, %(git_credential)s)
RETURNING *;

-- name: get_project
SELECT * FROM projects WHERE id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: get_project_for_update
SELECT * FROM projects WHERE id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL FOR UPDATE;

-- name: update_project
-- A NULL credential keeps the stored one. An expected version other than 0 must be the stored one
-- (compare-and-set): no row back when another save came in between.
UPDATE projects
   SET name = %(name)s, repository_url = %(repository_url)s, subdirectory = %(subdirectory)s,
       git_credential_kind = %(git_credential_kind)s, git_credential = coalesce(%(git_credential)s, git_credential),
       repository_id = %(repository_id)s, version = version + 1, updated_at = now()
 WHERE id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
   AND (%(expected_version)s::bigint = 0 OR version = %(expected_version)s::bigint)
RETURNING *;

-- name: delete_project
WITH project AS (
    UPDATE projects SET deleted_at = now(), git_credential = ''
     WHERE id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
    RETURNING id
)
UPDATE environments e SET deleted_at = now(), connection_secrets = '{}'::jsonb, secret_variables = '{}'::jsonb
  FROM project WHERE e.project_id = project.id AND e.deleted_at IS NULL
RETURNING e.id;

-- name: live_jobs_of_environments
-- The live jobs that use any of these environments (what stops their deletion).
SELECT j.id FROM jobs j
 WHERE j.environment_id = ANY(%(environment_ids)b::bigint[]) AND j.deleted_at IS NULL
 ORDER BY j.id LIMIT 10;

-- name: environment_ids_of_project
SELECT id FROM environments WHERE project_id = %(project_id)s AND deleted_at IS NULL;

-- name: list_projects
SELECT * FROM projects WHERE account_id = %(account_id)s AND deleted_at IS NULL ORDER BY id;

-- name: insert_environment
INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, git_branch, adapter_type,
                          connection, connection_secrets, target_name, schema_name, threads, variables,
                          secret_variables)
VALUES (%(account_id)s, %(project_id)s, %(name)s, %(environment_type)s, %(dbt_version)s, %(git_branch)s,
        %(adapter_type)s, %(connection)s, %(connection_secrets)s, %(target_name)s, %(schema_name)s, %(threads)s,
        %(variables)s, %(set_secrets)s)
RETURNING *;

-- name: get_environment
SELECT * FROM environments WHERE id = %(environment_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: get_environment_for_update
SELECT * FROM environments
 WHERE id = %(environment_id)s AND account_id = %(account_id)s AND deleted_at IS NULL FOR UPDATE;

-- name: update_environment
UPDATE environments
   SET name = %(name)s, environment_type = %(environment_type)s, dbt_version = %(dbt_version)s,
       git_branch = %(git_branch)s, adapter_type = %(adapter_type)s, connection = %(connection)s,
       connection_secrets = %(connection_secrets)s, target_name = %(target_name)s, schema_name = %(schema_name)s,
       threads = %(threads)s, variables = %(variables)s,
       -- As a job's: set or unset one by one; a secret the update does not name keeps its value.
       secret_variables = (secret_variables - %(unset_secrets)b::text[]) || %(set_secrets)s,
       version = version + 1, updated_at = now()
 WHERE id = %(environment_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
   -- As a project's: compare-and-set on the version the caller read, when it names one.
   AND (%(expected_version)s::bigint = 0 OR version = %(expected_version)s::bigint)
RETURNING *;

-- name: delete_environment
UPDATE environments SET deleted_at = now(), connection_secrets = '{}'::jsonb, secret_variables = '{}'::jsonb
 WHERE id = %(environment_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
RETURNING id;

-- name: list_environments
SELECT * FROM environments
WHERE account_id = %(account_id)s AND (%(project_id)s::bigint IS NULL OR project_id = %(project_id)s)
  AND deleted_at IS NULL
ORDER BY id;

-- The REST API (dbt Cloud's v2 shape): offset paging, a total count and a choice of order.
-- order_by is one of the names the REST layer allows; a leading '-' means descending.

-- name: get_account
-- The columns update_account_settings returns.
SELECT id, name, run_slots, deactivate_after_failures, pull_request_schema_max_age_days, run_retention_days,
       created_at, updated_at
  FROM accounts WHERE id = %(account_id)s;

-- name: update_account_settings
-- A setting given as NULL keeps its value.
UPDATE accounts
   SET deactivate_after_failures = COALESCE(%(deactivate_after_failures)s, deactivate_after_failures),
       pull_request_schema_max_age_days = COALESCE(%(pull_request_schema_max_age_days)s,
                                                   pull_request_schema_max_age_days),
       run_retention_days = COALESCE(%(run_retention_days)s, run_retention_days),
       updated_at = now()
 WHERE id = %(account_id)s
RETURNING id, name, run_slots, deactivate_after_failures, pull_request_schema_max_age_days, run_retention_days,
          created_at, updated_at;

-- name: count_runs
-- The filters of dbt Cloud's run list (list_runs_by_offset's); a run's dbt version is its override's, else
-- its job's environment's; docs and sources are the artifacts that generating them keeps.
SELECT count(*) AS total FROM runs
WHERE account_id = %(account_id)s
  AND (%(job_id)s::bigint IS NULL OR job_id = %(job_id)s)
  AND (cardinality(%(statuses)b::smallint[]) = 0 OR status = ANY(%(statuses)b::smallint[]))
  AND (%(deferring_run_id)s::bigint IS NULL OR deferring_run_id = %(deferring_run_id)s)
  AND (NOT %(by_environment)s OR job_id IN (
      SELECT j.id FROM jobs j JOIN environments e ON e.id = j.environment_id
       WHERE j.account_id = %(account_id)s
         AND (%(environment_id)s::bigint IS NULL OR e.id = %(environment_id)s)
         AND (cardinality(%(project_ids)b::bigint[]) = 0 OR e.project_id = ANY(%(project_ids)b::bigint[]))))
  AND (cardinality(%(run_ids)b::bigint[]) = 0 OR runs.id = ANY(%(run_ids)b::bigint[]))
  AND (%(id_gt)s::bigint IS NULL OR runs.id > %(id_gt)s)
  AND (cardinality(%(dbt_versions)b::text[]) = 0 OR COALESCE(NULLIF(runs.overrides->>'dbt_version', ''), (
      SELECT e.dbt_version FROM jobs j JOIN environments e ON e.id = j.environment_id WHERE j.id = runs.job_id
  )) = ANY(%(dbt_versions)b::text[]))
  AND (%(has_docs)s::boolean IS NULL OR %(has_docs)s = EXISTS (
      SELECT 1 FROM artifacts a WHERE a.run_id = runs.id AND a.path = 'target/catalog.json'))
  AND (%(has_sources)s::boolean IS NULL OR %(has_sources)s = EXISTS (
      SELECT 1 FROM artifacts a WHERE a.run_id = runs.id AND a.path = 'target/sources.json'))
  AND (%(created_from)s::timestamptz IS NULL OR runs.queued_at BETWEEN %(created_from)s AND %(created_to)s)
  AND (%(finished_from)s::timestamptz IS NULL OR runs.finished_at BETWEEN %(finished_from)s AND %(finished_to)s);

-- name: list_runs_by_offset
SELECT runs.*, env.environment_id, env.project_id, env.dbt_version FROM runs
LEFT JOIN LATERAL (
    SELECT e.id AS environment_id, e.project_id, e.dbt_version
      FROM jobs j JOIN environments e ON e.id = j.environment_id WHERE j.id = runs.job_id
) env ON true
WHERE account_id = %(account_id)s
  AND (%(job_id)s::bigint IS NULL OR job_id = %(job_id)s)
  AND (cardinality(%(statuses)b::smallint[]) = 0 OR status = ANY(%(statuses)b::smallint[]))
  AND (%(deferring_run_id)s::bigint IS NULL OR deferring_run_id = %(deferring_run_id)s)
  AND (NOT %(by_environment)s OR job_id IN (
      SELECT j.id FROM jobs j JOIN environments e ON e.id = j.environment_id
       WHERE j.account_id = %(account_id)s
         AND (%(environment_id)s::bigint IS NULL OR e.id = %(environment_id)s)
         AND (cardinality(%(project_ids)b::bigint[]) = 0 OR e.project_id = ANY(%(project_ids)b::bigint[]))))
  AND (cardinality(%(run_ids)b::bigint[]) = 0 OR runs.id = ANY(%(run_ids)b::bigint[]))
  AND (%(id_gt)s::bigint IS NULL OR runs.id > %(id_gt)s)
  AND (cardinality(%(dbt_versions)b::text[]) = 0 OR COALESCE(NULLIF(runs.overrides->>'dbt_version', ''), (
      SELECT e.dbt_version FROM jobs j JOIN environments e ON e.id = j.environment_id WHERE j.id = runs.job_id
  )) = ANY(%(dbt_versions)b::text[]))
  AND (%(has_docs)s::boolean IS NULL OR %(has_docs)s = EXISTS (
      SELECT 1 FROM artifacts a WHERE a.run_id = runs.id AND a.path = 'target/catalog.json'))
  AND (%(has_sources)s::boolean IS NULL OR %(has_sources)s = EXISTS (
      SELECT 1 FROM artifacts a WHERE a.run_id = runs.id AND a.path = 'target/sources.json'))
  AND (%(created_from)s::timestamptz IS NULL OR runs.queued_at BETWEEN %(created_from)s AND %(created_to)s)
  AND (%(finished_from)s::timestamptz IS NULL OR runs.finished_at BETWEEN %(finished_from)s AND %(finished_to)s)
ORDER BY
    CASE WHEN %(order_by)s = 'created_at' THEN queued_at END ASC,
    CASE WHEN %(order_by)s = '-created_at' THEN queued_at END DESC,
    CASE WHEN %(order_by)s = 'finished_at' THEN finished_at END ASC NULLS LAST,
    CASE WHEN %(order_by)s = '-finished_at' THEN finished_at END DESC NULLS LAST,
    CASE WHEN %(order_by)s = 'started_at' THEN started_at END ASC NULLS LAST,
    CASE WHEN %(order_by)s = '-started_at' THEN started_at END DESC NULLS LAST,
    CASE WHEN %(order_by)s = 'status' THEN status END ASC,
    CASE WHEN %(order_by)s = '-status' THEN status END DESC,
    CASE WHEN %(order_by)s LIKE '-%%' THEN id END DESC,
    id ASC
OFFSET %(offset)s
LIMIT %(limit)s;

-- name: count_jobs
-- The filters of dbt Cloud's job list; name_like is an ILIKE pattern with its wildcards escaped.
SELECT count(*) AS total FROM jobs AS jobs
WHERE account_id = %(account_id)s AND (%(deleted)s::boolean IS NULL OR (deleted_at IS NOT NULL) = %(deleted)s)
  AND (%(environment_id)s::bigint IS NULL OR environment_id = %(environment_id)s)
  AND (cardinality(%(project_ids)b::bigint[]) = 0 OR environment_id IN (
      SELECT e.id FROM environments e
       WHERE e.account_id = %(account_id)s AND e.project_id = ANY(%(project_ids)b::bigint[])))
  AND (%(name_like)s::text IS NULL OR name ILIKE %(name_like)s)
  AND (cardinality(%(job_ids)b::bigint[]) = 0 OR jobs.id = ANY(%(job_ids)b::bigint[]))
  AND (%(id_gt)s::bigint IS NULL OR jobs.id > %(id_gt)s)
  AND (cardinality(%(dbt_versions)b::text[]) = 0 OR (
      SELECT e.dbt_version FROM environments e WHERE e.id = jobs.environment_id) = ANY(%(dbt_versions)b::text[]))
  AND (%(scheduled)s::boolean IS NULL OR (cron IS NOT NULL) = %(scheduled)s);

-- name: list_jobs_by_offset
SELECT jobs.*, (SELECT e.project_id FROM environments e WHERE e.id = jobs.environment_id) AS project_id,
       (SELECT e.dbt_version FROM environments e WHERE e.id = jobs.environment_id) AS dbt_version
  FROM jobs
WHERE account_id = %(account_id)s AND (%(deleted)s::boolean IS NULL OR (deleted_at IS NOT NULL) = %(deleted)s)
  AND (%(environment_id)s::bigint IS NULL OR environment_id = %(environment_id)s)
  AND (cardinality(%(project_ids)b::bigint[]) = 0 OR environment_id IN (
      SELECT e.id FROM environments e
       WHERE e.account_id = %(account_id)s AND e.project_id = ANY(%(project_ids)b::bigint[])))
  AND (%(name_like)s::text IS NULL OR name ILIKE %(name_like)s)
  AND (cardinality(%(job_ids)b::bigint[]) = 0 OR jobs.id = ANY(%(job_ids)b::bigint[]))
  AND (%(id_gt)s::bigint IS NULL OR jobs.id > %(id_gt)s)
  AND (cardinality(%(dbt_versions)b::text[]) = 0 OR (
      SELECT e.dbt_version FROM environments e WHERE e.id = jobs.environment_id) = ANY(%(dbt_versions)b::text[]))
  AND (%(scheduled)s::boolean IS NULL OR (cron IS NOT NULL) = %(scheduled)s)
ORDER BY
    CASE WHEN %(order_by)s = 'name' THEN name END ASC,
    CASE WHEN %(order_by)s = '-name' THEN name END DESC,
    CASE WHEN %(order_by)s = 'created_at' THEN created_at END ASC,
    CASE WHEN %(order_by)s = '-created_at' THEN created_at END DESC,
    CASE WHEN %(order_by)s = 'updated_at' THEN updated_at END ASC,
    CASE WHEN %(order_by)s = '-updated_at' THEN updated_at END DESC,
    CASE WHEN %(order_by)s LIKE '-%%' THEN id END DESC,
    id ASC
OFFSET %(offset)s
LIMIT %(limit)s;

-- name: latest_run_of_job
SELECT * FROM runs WHERE job_id = %(job_id)s AND account_id = %(account_id)s ORDER BY id DESC LIMIT 1;

-- name: retries_of_runs
-- The runs that rerun or retry these runs (their parent), with their job's environment, project and dbt version.
SELECT runs.*, env.environment_id, env.project_id, env.dbt_version FROM runs
LEFT JOIN LATERAL (
    SELECT e.id AS environment_id, e.project_id, e.dbt_version
      FROM jobs j JOIN environments e ON e.id = j.environment_id WHERE j.id = runs.job_id
) env ON true
WHERE account_id = %(account_id)s AND parent_run_id = ANY(%(run_ids)b::bigint[])
ORDER BY id;

-- name: latest_docs_run
-- The job's latest successful run that kept dbt's docs site (its hosted docs).
SELECT id FROM runs
WHERE job_id = %(job_id)s AND account_id = %(account_id)s AND status = 10
  AND EXISTS (SELECT 1 FROM artifacts a WHERE a.run_id = runs.id AND a.path = 'target/index.html')
ORDER BY id DESC
LIMIT 1;

-- name: docs_of_runs
-- Which of the runs kept dbt's docs catalog or its source freshness results.
SELECT run_id, path FROM artifacts
WHERE run_id = ANY(%(run_ids)b::bigint[]) AND path IN ('target/catalog.json', 'target/sources.json');

-- name: step_logs
-- A run's log text per step, for the REST API's run_steps.
SELECT run_id, step_index, string_agg(text, '' ORDER BY seq) AS text FROM run_log_chunks
WHERE run_id = ANY(%(run_ids)b::bigint[])
GROUP BY run_id, step_index;

-- name: list_artifacts_of_step
-- Each path once: the step's file, or without a step the last step's (as get_artifact serves it).
SELECT DISTINCT ON (path) path, step_index, octet_length(content) AS size_bytes, created_at FROM artifacts
WHERE run_id = %(run_id)s AND (%(step_index)s::integer IS NULL OR step_index = %(step_index)s)
ORDER BY path, step_index DESC;

-- The web pages: keyset pages of 50 by id, newest first (the indexes are in migration 0017); the
-- on-time view over a window of queued_at.

-- name: runs_page
SELECT r.id, r.job_id, j.name AS job_name, r.status, r.trigger, r.cause, r.attempt, r.waiting_reason,
       r.status_message, r.scheduled_at, r.queued_at, r.dispatched_at, r.started_at, r.finished_at,
       r.job_type, r.git_sha, r.overrides, r.schema_name AS run_schema, j.schema_name AS job_schema,
       e.id AS environment_id, e.name AS environment_name, e.schema_name AS environment_schema, e.project_id
  FROM runs r JOIN jobs j ON j.id = r.job_id LEFT JOIN environments e ON e.id = j.environment_id
 WHERE r.account_id = %(account_id)s
   AND (%(job_id)s::bigint IS NULL OR r.job_id = %(job_id)s)
   AND (%(environment_id)s::bigint IS NULL OR j.environment_id = %(environment_id)s)
   AND (%(project_id)s::bigint IS NULL OR e.project_id = %(project_id)s)
   AND (%(status)s::smallint IS NULL OR r.status = %(status)s)
   AND (%(trigger)s::text IS NULL OR r.trigger = %(trigger)s)
   AND (%(since)s::timestamptz IS NULL OR r.queued_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR r.queued_at < %(until)s)
   -- The on-time page's buckets of run delay (as on_time_split counts them) and its reasons to wait.
   AND (%(delay)s::text IS NULL OR CASE %(delay)s
        WHEN 'within_25s' THEN r.started_at - r.scheduled_at <= interval '25 seconds'
        WHEN 'within_60s' THEN r.started_at - r.scheduled_at > interval '25 seconds'
                           AND r.started_at - r.scheduled_at <= interval '60 seconds'
        WHEN 'late' THEN r.started_at - r.scheduled_at > interval '60 seconds'
        WHEN 'late_own' THEN r.started_at - r.scheduled_at > interval '60 seconds'
                         AND (r.started_at - r.scheduled_at) - (r.dispatched_at - r.queued_at) <= interval '60 seconds'
        WHEN 'late_platform' THEN (r.started_at - r.scheduled_at) - (r.dispatched_at - r.queued_at) > interval '60 seconds'
        END)
   AND (%(waiting)s::text IS NULL OR (r.status = 1 AND r.waiting_reason = %(waiting)s))
   AND (%(after_id)s::bigint IS NULL OR r.id < %(after_id)s)
 ORDER BY r.id DESC
 LIMIT %(limit)s;

-- name: on_time_split
-- Runs queued in the window that started: the on-time split of run delay and its percentiles.
SELECT count(*) AS started,
       count(*) FILTER (WHERE started_at - scheduled_at <= interval '25 seconds') AS within_25s,
       count(*) FILTER (WHERE started_at - scheduled_at > interval '25 seconds'
                          AND started_at - scheduled_at <= interval '60 seconds') AS within_60s,
       count(*) FILTER (WHERE started_at - scheduled_at > interval '60 seconds') AS late,
       -- Late runs that the account's own limits made late (without their wait for a run slot or
       -- their job's previous run they would have been on time), and those the platform made late.
       count(*) FILTER (WHERE started_at - scheduled_at > interval '60 seconds'
                          AND (started_at - scheduled_at) - (dispatched_at - queued_at) <= interval '60 seconds')
         AS late_own,
       count(*) FILTER (WHERE (started_at - scheduled_at) - (dispatched_at - queued_at) > interval '60 seconds')
         AS late_platform,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - scheduled_at)) AS delay_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - scheduled_at)) AS delay_p99,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - dispatched_at)) AS prep_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - dispatched_at)) AS prep_p99
  FROM runs
 WHERE account_id = %(account_id)s AND queued_at >= %(since)s AND started_at IS NOT NULL;

-- name: waiting_now
-- The account's queued runs by why they wait (empty: due, not looked at yet); those whose time has not
-- come (queued for later) apart: nothing holds them up.
SELECT CASE WHEN scheduled_at > now() THEN '' ELSE waiting_reason END AS waiting_reason,
       scheduled_at > now() AS not_due, count(*) AS runs, min(queued_at) AS oldest_queued_at
  FROM runs
 WHERE account_id = %(account_id)s AND status = 1
 GROUP BY 1, 2
 ORDER BY 2, 1;

-- name: account_tokens
-- The settings page: the account's tokens that still work, by what they are named and may do, never
-- their hash; the newest first.
SELECT id, name, token_prefix, scopes, created_at, expires_at, last_used_at
  FROM api_tokens
 WHERE account_id = %(account_id)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
 ORDER BY id DESC
 LIMIT 200;

-- name: account_webhooks
-- The settings page: the account's webhook subscriptions, never their signing secret.
SELECT id, name, client_url, event_types, cardinality(job_ids) AS job_count, active, created_at
  FROM webhook_subscriptions
 WHERE account_id = %(account_id)s
 ORDER BY created_at, id;

-- name: run_slots_in_use
-- As the dispatcher counts them: starting and running runs that take a slot (CI runs take none).
SELECT count(*) FROM runs WHERE account_id = %(account_id)s AND status IN (2, 3) AND takes_slot;

-- name: job_names
SELECT id, name FROM jobs WHERE account_id = %(account_id)s AND deleted_at IS NULL ORDER BY name, id LIMIT 500;

-- name: search_jobs
-- The web pages' search: live jobs by id, or whose name holds the words (case-insensitive).
SELECT id, name, job_type, cron, timezone, paused_at, deactivated_at FROM jobs
 WHERE account_id = %(account_id)s AND deleted_at IS NULL
   AND (id = %(id)s OR name ILIKE %(pattern)s::text)
 ORDER BY name, id
 LIMIT %(limit)s;

-- name: search_runs
-- The web pages' search: a run by id, or the newest runs whose job's name or cause holds the words.
SELECT r.id, r.job_id, j.name AS job_name, r.status, r.trigger, r.cause, r.attempt, r.waiting_reason,
       r.status_message, r.scheduled_at, r.queued_at, r.dispatched_at, r.started_at, r.finished_at,
       r.job_type, r.git_sha, r.overrides, r.schema_name AS run_schema, j.schema_name AS job_schema,
       e.id AS environment_id, e.name AS environment_name, e.schema_name AS environment_schema, e.project_id
  FROM runs r JOIN jobs j ON j.id = r.job_id LEFT JOIN environments e ON e.id = j.environment_id
 WHERE r.account_id = %(account_id)s
   AND (r.id = %(id)s OR j.name ILIKE %(pattern)s::text OR r.cause ILIKE %(pattern)s::text)
 ORDER BY r.id DESC
 LIMIT %(limit)s;

-- name: claim_warehouse_directory
-- The environment holding the directory: this one when it is new or already its own.
WITH claimed AS (
    INSERT INTO warehouse_directories (directory, account_id, environment_id)
    VALUES (%(directory)s, %(account_id)s, %(environment_id)s)
    ON CONFLICT (directory) DO NOTHING
    RETURNING environment_id
)
SELECT environment_id FROM claimed
UNION ALL
SELECT environment_id FROM warehouse_directories WHERE directory = %(directory)s
LIMIT 1;

-- name: warehouse_directory_holder
SELECT environment_id FROM warehouse_directories WHERE directory = %(directory)s;

-- name: skipped_occurrences
-- A job's cron occurrences that got no run (runplane/basics/overlap.py), newest first.
SELECT job_id, scheduled_at, reason, detail, blocking_run_id, recorded_at
  FROM skipped_occurrences
 WHERE account_id = %(account_id)s AND job_id = %(job_id)s
 ORDER BY scheduled_at DESC, id DESC
 LIMIT %(limit)s;

-- name: run_in_progress_like
-- What a reattaching trigger answers: the job's newest run in progress with the same overrides
-- (jsonb equality: the same keys and values, whatever their order), of any trigger.
SELECT * FROM runs
 WHERE job_id = %(job_id)s AND status IN (1, 2, 3) AND overrides = %(overrides)s
 ORDER BY id DESC
 LIMIT 1;

-- Repositories made on their own (a project is attached to one by its id)

-- name: insert_repository
INSERT INTO repositories (account_id, project_id, remote_url, git_credential_kind, git_credential)
VALUES (%(account_id)s, %(project_id)s, %(remote_url)s, %(git_credential_kind)s, %(git_credential)s)
RETURNING *;

-- name: get_repository
SELECT * FROM repositories
 WHERE id = %(repository_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: list_repositories
SELECT * FROM repositories
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND deleted_at IS NULL ORDER BY id;

-- name: delete_repository
UPDATE repositories SET deleted_at = now(), git_credential = ''
 WHERE id = %(repository_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- Warehouse connections (no secrets) and credentials (the secret part) made on their own

-- name: insert_connection
INSERT INTO connections (account_id, name, adapter_type, details)
VALUES (%(account_id)s, %(name)s, %(adapter_type)s, %(details)s)
RETURNING *;

-- name: get_connection
SELECT * FROM connections WHERE id = %(connection_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: list_connections
SELECT * FROM connections WHERE account_id = %(account_id)s AND deleted_at IS NULL ORDER BY id;

-- name: update_connection
UPDATE connections SET name = %(name)s, details = %(details)s, updated_at = now()
 WHERE id = %(connection_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
RETURNING *;

-- name: delete_connection
UPDATE connections SET deleted_at = now()
 WHERE id = %(connection_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: insert_credentials
INSERT INTO credentials (account_id, project_id, adapter_type, details, secrets, schema_name, threads, target_name)
VALUES (%(account_id)s, %(project_id)s, %(adapter_type)s, %(details)s, %(secrets)s, %(schema_name)s, %(threads)s,
        %(target_name)s)
RETURNING *;

-- name: get_credentials
SELECT * FROM credentials WHERE id = %(credentials_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: list_credentials
SELECT * FROM credentials
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND deleted_at IS NULL ORDER BY id;

-- name: update_credentials
UPDATE credentials
   SET details = %(details)s, secrets = %(secrets)s, schema_name = %(schema_name)s, threads = %(threads)s,
       target_name = %(target_name)s, updated_at = now()
 WHERE id = %(credentials_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
RETURNING *;

-- name: delete_credentials
UPDATE credentials SET deleted_at = now(), secrets = '{}'::jsonb
 WHERE id = %(credentials_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;

-- name: set_environment_extras
-- What dbt Cloud's environments carry besides: saved with the environment, in its transaction.
UPDATE environments
   SET description = %(description)s, deployment_type = %(deployment_type)s,
       connection_id = %(connection_id)s, credentials_id = %(credentials_id)s
 WHERE id = %(environment_id)s AND account_id = %(account_id)s
RETURNING *;

-- name: set_project_description
UPDATE projects SET description = %(description)s WHERE id = %(project_id)s AND account_id = %(account_id)s
RETURNING *;

-- name: delete_project_parts
-- A deleted project's repositories and credentials go with it, their secrets forgotten.
WITH repositories_gone AS (
    UPDATE repositories SET deleted_at = now(), git_credential = ''
     WHERE project_id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL
)
UPDATE credentials SET deleted_at = now(), secrets = '{}'::jsonb
 WHERE project_id = %(project_id)s AND account_id = %(account_id)s AND deleted_at IS NULL;
