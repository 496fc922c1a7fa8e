-- Projects and environments carry a version, as jobs do: every save bumps it, and a save that names
-- the version it was read at is refused when another save came in between, instead of silently
-- reverting that change.

ALTER TABLE projects ADD COLUMN version bigint NOT NULL DEFAULT 1;
ALTER TABLE environments ADD COLUMN version bigint NOT NULL DEFAULT 1;
