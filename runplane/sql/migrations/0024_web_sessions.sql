-- The web pages' sessions. The browser's cookie holds a random session id; only its sha256 is kept
-- here, with the account and the API token the session was made from. A session is good until its
-- expiry, and only while that token is neither revoked nor expired; logging out deletes it.
CREATE TABLE web_sessions (
    id_hash       bytea PRIMARY KEY,              -- sha256 of the session id; the id itself is never stored
    account_id    bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    token_id      bigint NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX web_sessions_token_idx ON web_sessions (token_id);
CREATE INDEX web_sessions_expires_idx ON web_sessions (expires_at);

-- The one statement of which API tokens work now: the APIs' calls and the web sessions read it.
CREATE VIEW live_api_tokens AS
SELECT id, account_id, token_hash, scopes, expires_at FROM api_tokens
 WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now());
