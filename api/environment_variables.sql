-- Environment variables of a project at its three levels (dbt Cloud's v3 environment-variables calls).

-- name: variable_id
INSERT INTO environment_variable_ids (account_id, project_id, name, level, scope_id)
VALUES (%(account_id)s, %(project_id)s, %(name)s, %(level)s, %(scope_id)s)
ON CONFLICT (project_id, name, level, scope_id) DO UPDATE SET account_id = EXCLUDED.account_id
RETURNING id;

-- name: variable_by_id
SELECT id, project_id, name, level, scope_id FROM environment_variable_ids
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND id = %(id)s;

-- name: project_variables
SELECT name, value, secret FROM project_variables WHERE project_id = %(project_id)s ORDER BY name;

-- name: set_project_variable
INSERT INTO project_variables (project_id, name, value, secret)
VALUES (%(project_id)s, %(name)s, %(value)s, %(secret)s)
ON CONFLICT (project_id, name) DO UPDATE SET value = EXCLUDED.value, secret = EXCLUDED.secret;

-- name: unset_project_variable
DELETE FROM project_variables WHERE project_id = %(project_id)s AND name = %(name)s;

-- name: project_environments
SELECT id, name, variables, secret_variables FROM environments
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND deleted_at IS NULL
 ORDER BY id;

-- name: set_environment_variable
UPDATE environments
   SET variables = CASE WHEN %(secret)s THEN variables - %(name)s::text
                        ELSE variables || jsonb_build_object(%(name)s::text, %(value)s::text) END,
       secret_variables = CASE WHEN %(secret)s THEN secret_variables || jsonb_build_object(%(name)s::text, %(value)s::text)
                               ELSE secret_variables - %(name)s::text END,
       version = version + 1, updated_at = now()
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND id = %(scope_id)s AND deleted_at IS NULL
RETURNING id;

-- name: unset_environment_variable
UPDATE environments
   SET variables = variables - %(name)s::text, secret_variables = secret_variables - %(name)s::text,
       version = version + 1, updated_at = now()
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s AND id = %(scope_id)s AND deleted_at IS NULL
RETURNING id;

-- name: job_variables
-- A job of the project (through its environment) with its overrides and its environment's values.
SELECT j.id, j.environment_id, j.environment, j.secret_environment, e.variables AS environment_variables,
       e.secret_variables AS environment_secret_variables
  FROM jobs j JOIN environments e ON e.id = j.environment_id
 WHERE j.account_id = %(account_id)s AND j.id = %(job_id)s AND e.project_id = %(project_id)s AND j.deleted_at IS NULL;

-- name: set_job_variable
UPDATE jobs j
   SET environment = CASE WHEN %(secret)s THEN j.environment - %(name)s::text
                          ELSE j.environment || jsonb_build_object(%(name)s::text, %(value)s::text) END,
       secret_environment = CASE WHEN %(secret)s
                                 THEN j.secret_environment || jsonb_build_object(%(name)s::text, %(value)s::text)
                                 ELSE j.secret_environment - %(name)s::text END,
       version = j.version + 1, updated_at = now()
  FROM environments e
 WHERE e.id = j.environment_id AND e.project_id = %(project_id)s
   AND j.account_id = %(account_id)s AND j.id = %(scope_id)s AND j.deleted_at IS NULL
RETURNING j.id;

-- name: unset_job_variable
UPDATE jobs j
   SET environment = j.environment - %(name)s::text, secret_environment = j.secret_environment - %(name)s::text,
       version = j.version + 1, updated_at = now()
  FROM environments e
 WHERE e.id = j.environment_id AND e.project_id = %(project_id)s
   AND j.account_id = %(account_id)s AND j.id = %(scope_id)s AND j.deleted_at IS NULL
RETURNING j.id;
