-- When each API token was last used (by a call, or by a page of a session it opened), so that the
-- account's settings page can show which tokens are still in use. Written at most once a minute per
-- token: an API call does not become a write each time.
ALTER TABLE api_tokens ADD COLUMN last_used_at timestamptz;
