-- Projects (an account's dbt repository) and environments (where its runs execute: dbt version,
-- warehouse connection, default target/schema/threads). A job with an environment runs dbt; a job
-- without one runs plain commands. Secret fields are Fernet tokens (runplane.secrets), never plain.

CREATE TABLE projects (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name                  text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    repository_url        text NOT NULL,
    subdirectory          text NOT NULL DEFAULT '',
    git_credential_kind   text NOT NULL DEFAULT 'none' CHECK (git_credential_kind IN ('none', 'token', 'ssh_key')),
    git_credential        text NOT NULL DEFAULT '',   -- encrypted token or deploy key
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projects_account_idx ON projects (account_id, id);

CREATE TABLE environments (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    project_id            bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                  text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    environment_type      text NOT NULL CHECK (environment_type IN ('deployment', 'development')),
    dbt_version           text NOT NULL,
    git_branch            text NOT NULL DEFAULT '',   -- empty: the repository's default branch
    adapter_type          text NOT NULL,
    connection            jsonb NOT NULL DEFAULT '{}'::jsonb,   -- the fields that are not secret
    connection_secrets    jsonb NOT NULL DEFAULT '{}'::jsonb,   -- field -> encrypted value
    target_name           text NOT NULL DEFAULT 'default',
    schema_name           text NOT NULL,
    threads               integer NOT NULL DEFAULT 4 CHECK (threads BETWEEN 1 AND 64),
    variables             jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX environments_account_idx ON environments (account_id, id);

ALTER TABLE jobs ADD COLUMN environment_id bigint REFERENCES environments (id);
-- 0 on a job with an environment: the environment's default.
ALTER TABLE jobs ALTER COLUMN threads SET DEFAULT 0;
ALTER TABLE jobs ADD COLUMN schema_name text NOT NULL DEFAULT '';

-- The commit a run checked out, recorded by the runner before its first step.
ALTER TABLE runs ADD COLUMN git_sha text NOT NULL DEFAULT '';

-- Steps end truthfully: skipped after a failure, or the signal that ended them.
ALTER TABLE run_steps ADD COLUMN skipped boolean NOT NULL DEFAULT false;
ALTER TABLE run_steps ADD COLUMN end_reason text NOT NULL DEFAULT '';

-- Artifacts are kept per step: a later step's run_results.json no longer replaces the build's.
ALTER TABLE artifacts DROP CONSTRAINT artifacts_pkey;
ALTER TABLE artifacts ADD PRIMARY KEY (run_id, path, step_index);
