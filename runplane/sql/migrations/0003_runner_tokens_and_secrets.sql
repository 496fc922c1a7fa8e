-- Runners hold no control-plane credential: each launch gets a token for its one run (sha256 kept).
ALTER TABLE runs ADD COLUMN runner_token_hash bytea;

-- Secret environment variables (DBT_ENV_SECRET_*): name -> Fernet ciphertext, never the value.
ALTER TABLE jobs ADD COLUMN secret_environment jsonb NOT NULL DEFAULT '{}'::jsonb;

-- API tokens: a name, what they may do, and an optional end.
ALTER TABLE api_tokens
    ADD COLUMN name text NOT NULL DEFAULT '',
    ADD COLUMN scopes text[] NOT NULL DEFAULT '{account_admin}'
        CHECK (scopes <@ ARRAY['read_only', 'job_admin', 'account_admin']::text[] AND cardinality(scopes) >= 1),
    ADD COLUMN expires_at timestamptz;
