-- An environment's warehouse directory (DuckDB's file lives in <root>/<directory>/): the environment
-- that named a directory first keeps it, so no other environment, of any account, can name a file in
-- it. A claim outlives a change of the environment's path and its deletion: the files stay there,
-- and the runner only lets the runs of the directory's own group in (a directory passed on after its
-- environment's account is gone is refused at run time).

CREATE TABLE warehouse_directories (
    directory       text PRIMARY KEY,
    account_id      bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    environment_id  bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    claimed_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX warehouse_directories_environment_idx ON warehouse_directories (environment_id);
