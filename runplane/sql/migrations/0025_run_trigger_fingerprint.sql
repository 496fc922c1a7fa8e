-- What a trigger with a client's idempotency key asked for (a digest of its validated request, see
-- api/idempotency.py): a retry with the same key and another request is refused instead of
-- returning a run it did not describe. NULL: no client key, or queued before the digest was kept
-- (any retry matches).
ALTER TABLE runs ADD COLUMN trigger_fingerprint text;
