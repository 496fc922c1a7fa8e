-- What a keyed job create asked for (a digest of its validated definition, secret values left out):
-- a retry with the same key and another definition is refused instead of returning a job it did not
-- describe. NULL: created without a key, or before the digest was kept (any retry matches).
ALTER TABLE jobs ADD COLUMN create_fingerprint text;
