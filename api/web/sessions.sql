-- The web pages' sessions (migration 0024): rows keyed by the sha256 of the id in the cookie.

-- name: start_session
-- Only from a token that works now (live_api_tokens); nothing is inserted (no row returned) otherwise.
WITH token AS (SELECT id, account_id, scopes FROM live_api_tokens WHERE token_hash = %(token_hash)s),
made AS (
    INSERT INTO web_sessions (id_hash, account_id, token_id, expires_at)
    SELECT %(id_hash)s, account_id, id, now() + make_interval(secs => %(lifetime_seconds)s) FROM token
    RETURNING account_id, token_id, expires_at
)
SELECT made.account_id, made.token_id, made.expires_at, token.scopes FROM made JOIN token ON token.id = made.token_id;

-- name: resolve_session
-- Read on every page (no cache): logging out, the session's expiry and its token's revocation or
-- expiry each end it at once. A session it finds is marked seen.
-- Its token is marked used, at most once a minute.
WITH seen AS (
    UPDATE web_sessions s SET last_seen_at = now()
      FROM live_api_tokens t
     WHERE s.id_hash = %(id_hash)s AND s.expires_at > now() AND t.id = s.token_id
    RETURNING s.account_id, s.token_id, s.expires_at, t.scopes
),
used AS (
    UPDATE api_tokens t SET last_used_at = now()
      FROM seen
     WHERE t.id = seen.token_id AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')
)
SELECT account_id, token_id, expires_at, scopes FROM seen;

-- name: end_session
DELETE FROM web_sessions WHERE id_hash = %(id_hash)s;

-- name: forget_ended_sessions
-- Rows no page can use any more: past their expiry, or made from a token that no longer works.
DELETE FROM web_sessions s
 WHERE s.expires_at <= now() OR NOT EXISTS (SELECT 1 FROM live_api_tokens t WHERE t.id = s.token_id);
