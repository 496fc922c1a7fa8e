-- Warm Pod pools: started runner Pods that wait on the runner API (WaitForRun) for a run. One row
-- per pool Pod, made by the dispatcher that creates the Pod. The Pod's own token (in its Secret,
-- stored here hashed) only lets it wait for one run: once a run is handed to it, the token is
-- spent, so what a run's steps could read in that Pod is worth nothing.

CREATE TABLE pool_runners (
    name         text PRIMARY KEY,                     -- the Pod's name
    cluster      text NOT NULL,
    pool         text NOT NULL,
    token_hash   bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    seen_at      timestamptz,                          -- its last WaitForRun: a silent Pod is replaced
    run_id       bigint REFERENCES runs (id) ON DELETE SET NULL,
    run_attempt  integer,                              -- the launch of run_id it was given
    assigned_at  timestamptz,                          -- a dispatcher gave it run_id
    handed_at    timestamptz                           -- the Pod received the run's token: spent
);
CREATE INDEX pool_runners_waiting_idx ON pool_runners (cluster, pool, seen_at) WHERE assigned_at IS NULL;
