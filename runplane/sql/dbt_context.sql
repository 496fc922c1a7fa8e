-- What a run of a job with an environment needs to run dbt (runplane/dbt_context.py).

-- name: dbt_context
SELECT r.id AS run_id, r.job_id, r.account_id, r.job_type, r.trigger, r.cause, r.overrides,
       r.schema_name AS run_schema, r.pull_request_number,
       j.schema_name AS job_schema, j.target_name AS job_target_name, j.threads AS job_threads,
       j.git_branch AS job_git_branch,
       e.id AS environment_id, e.environment_type, e.dbt_version, e.git_branch AS environment_git_branch,
       e.adapter_type, e.connection, e.connection_secrets, e.target_name AS environment_target_name,
       e.schema_name AS environment_schema, e.threads AS environment_threads, e.variables,
       p.id AS project_id, p.repository_url, p.subdirectory, p.git_credential_kind, p.git_credential
  FROM runs r
  JOIN jobs j ON j.id = r.job_id
  JOIN environments e ON e.id = j.environment_id
  JOIN projects p ON p.id = e.project_id
 WHERE r.id = %(run_id)s
