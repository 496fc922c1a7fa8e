-- Steps of `runplane migrate` that run after the SQL migrations because they need the secret keys.

-- name: environments_with_plaintext_secrets
-- Environments whose clear variables still hold secret ones (stored so before migration 0023).
SELECT id, variables FROM environments
 WHERE EXISTS (SELECT 1 FROM jsonb_object_keys(variables) AS name WHERE starts_with(name, %(prefix)s))
 ORDER BY id
   FOR UPDATE;

-- name: seal_environment_secrets
UPDATE environments
   SET variables = variables - %(names)b::text[], secret_variables = secret_variables || %(sealed)s
 WHERE id = %(environment_id)s;
