-- Repositories made on their own, as dbt Cloud's v3 API makes them, in a project: a project is then
-- attached to one by its id (its repository URL and credential become the project's, which runs
-- clone from). The credential is ciphertext, as a project's is.
CREATE TABLE repositories (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    project_id            bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    remote_url            text NOT NULL,
    git_credential_kind   text NOT NULL DEFAULT 'none' CHECK (git_credential_kind IN ('none', 'token', 'ssh_key')),
    git_credential        text NOT NULL DEFAULT '',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);
CREATE INDEX repositories_account_idx ON repositories (account_id, project_id, id);

-- The repository a project was last attached to (NULL: its repository was given inline).
ALTER TABLE projects ADD COLUMN repository_id bigint REFERENCES repositories (id) ON DELETE SET NULL;

-- Warehouse connections (the details, no secrets) of the account and credentials (the secret part,
-- the schema, threads and target) of a project, made on their own as dbt Cloud's v3 API makes them:
-- an environment named with both gets the connection it would get inline. Secrets are ciphertext.
CREATE TABLE connections (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name                  text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    adapter_type          text NOT NULL,
    details               jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);
CREATE INDEX connections_account_idx ON connections (account_id, id);

CREATE TABLE credentials (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    project_id            bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    adapter_type          text NOT NULL,
    details               jsonb NOT NULL DEFAULT '{}'::jsonb,   -- the fields that are not secret (user)
    secrets               jsonb NOT NULL DEFAULT '{}'::jsonb,   -- encrypted values
    schema_name           text NOT NULL,
    threads               integer NOT NULL DEFAULT 4 CHECK (threads BETWEEN 1 AND 64),
    target_name           text NOT NULL DEFAULT 'default',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);
CREATE INDEX credentials_account_idx ON credentials (account_id, project_id, id);

-- What dbt Cloud's environments carry besides: a description, production or staging (or neither),
-- and the connection and credentials they were made from (NULL: given inline).
ALTER TABLE environments
    ADD COLUMN description text NOT NULL DEFAULT '',
    ADD COLUMN deployment_type text CHECK (deployment_type IN ('production', 'staging')),
    ADD COLUMN connection_id bigint REFERENCES connections (id) ON DELETE SET NULL,
    ADD COLUMN credentials_id bigint REFERENCES credentials (id) ON DELETE SET NULL;
ALTER TABLE projects ADD COLUMN description text NOT NULL DEFAULT '';
