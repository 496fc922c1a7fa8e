-- The system of record. Run statuses use the dbt Cloud API codes:
-- queued 1, starting 2, running 3, success 10, error 20, cancelled 30.

CREATE TABLE accounts (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    run_slots     integer NOT NULL CHECK (run_slots >= 0),
    memory_mb     integer NOT NULL DEFAULT 1024 CHECK (memory_mb > 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id            bigserial PRIMARY KEY,
    account_id    bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    token_hash    bytea NOT NULL UNIQUE,          -- sha256 of the token; the token itself is never stored
    token_prefix  text NOT NULL,                  -- first characters, to recognise a token in a list
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE TABLE jobs (
    id                       bigserial PRIMARY KEY,
    account_id               bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name                     text NOT NULL,
    job_type                 text NOT NULL CHECK (job_type IN ('deploy', 'ci', 'merge', 'adhoc')),
    steps                    text[] NOT NULL CHECK (cardinality(steps) >= 1),
    cron                     text,                 -- NULL: no schedule
    timezone                 text NOT NULL DEFAULT 'UTC',
    on_pull_request          boolean NOT NULL DEFAULT false,
    on_merge                 boolean NOT NULL DEFAULT false,
    threads                  integer NOT NULL DEFAULT 4,
    timeout_seconds          integer NOT NULL DEFAULT 0,
    target_name              text NOT NULL DEFAULT '',
    environment              jsonb NOT NULL DEFAULT '{}'::jsonb,
    git_branch               text NOT NULL DEFAULT '',
    retry_max_attempts       integer NOT NULL DEFAULT 0,
    retry_on_step_failure    boolean NOT NULL DEFAULT false,
    missed_run_grace_seconds integer NOT NULL DEFAULT 300,
    priority                 integer NOT NULL DEFAULT 0,
    deactivated_at           timestamptz,          -- NULL: active
    deactivation_reason      text NOT NULL DEFAULT '',
    consecutive_failures     integer NOT NULL DEFAULT 0,
    deleted_at               timestamptz,          -- soft delete: its runs stay readable
    version                  bigint NOT NULL DEFAULT 1,  -- bumped on every change
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_account_idx ON jobs (account_id, id) WHERE deleted_at IS NULL;
CREATE INDEX jobs_version_idx ON jobs (id, version);

CREATE TABLE job_completion_triggers (
    job_id           bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,  -- downstream
    upstream_job_id  bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    statuses         smallint[] NOT NULL,
    PRIMARY KEY (job_id, upstream_job_id)
);
CREATE INDEX job_completion_triggers_upstream_idx ON job_completion_triggers (upstream_job_id);

CREATE TABLE runs (
    id                   bigserial PRIMARY KEY,
    account_id           bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    job_id               bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    job_type             text NOT NULL CHECK (job_type IN ('deploy', 'ci', 'merge', 'adhoc')),
    status               smallint NOT NULL DEFAULT 1 CHECK (status IN (1, 2, 3, 10, 20, 30)),
    trigger              text NOT NULL CHECK (trigger IN
                             ('schedule', 'api', 'manual', 'ci', 'merge', 'completion', 'retry')),
    cause                text NOT NULL DEFAULT '',
    idempotency_key      text NOT NULL UNIQUE,
    attempt              integer NOT NULL DEFAULT 1,
    parent_run_id        bigint REFERENCES runs (id) ON DELETE SET NULL,
    upstream_run_id      bigint REFERENCES runs (id) ON DELETE SET NULL,
    priority             integer NOT NULL DEFAULT 0,
    takes_slot           boolean NOT NULL,            -- CI runs take none
    overrides            jsonb NOT NULL DEFAULT '{}'::jsonb,
    pull_request_number  integer,
    schema_name          text NOT NULL DEFAULT '',
    waiting_reason       text NOT NULL DEFAULT '',
    status_message       text NOT NULL DEFAULT '',
    retries_exhausted    boolean NOT NULL DEFAULT false,
    cancel_requested_at  timestamptz,
    launch_attempts      integer NOT NULL DEFAULT 0,
    not_before           timestamptz,                 -- relaunch backoff after a launch failure
    lease_owner          text,                        -- the runner holding the run
    lease_expires_at     timestamptz,
    heartbeat_at         timestamptz,
    pod_name             text NOT NULL DEFAULT '',
    cluster              text NOT NULL DEFAULT '',
    trace_parent         text NOT NULL DEFAULT '',     -- W3C traceparent of the span that queued the run
    observed             smallint NOT NULL DEFAULT 0,  -- metrics recorded: 1 queued, 2 started, 4 finished
    scheduled_at         timestamptz NOT NULL,        -- cron fire time, or trigger time
    queued_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    dispatched_at        timestamptz,
    started_at           timestamptz,
    finished_at          timestamptz
);
-- Hot path of the scheduler loop and the dispatchers: queued runs per account in order.
CREATE INDEX runs_queued_idx ON runs (account_id, priority DESC, queued_at, id) WHERE status = 1;
-- Slots and serial execution: what is starting or running.
CREATE INDEX runs_active_idx ON runs (account_id, job_id) WHERE status IN (2, 3);
CREATE INDEX runs_job_idx ON runs (job_id, id DESC);
-- The scheduler loop turns run rows into metrics once each: what it has not recorded yet.
CREATE INDEX runs_unobserved_idx ON runs (id) WHERE observed <> 7;
CREATE INDEX runs_account_idx ON runs (account_id, id DESC);
-- Over-scheduling: the queuer cancels a job's older cron runs that are still queued.
CREATE INDEX runs_schedule_queued_idx ON runs (job_id, scheduled_at) WHERE status = 1 AND trigger = 'schedule';

CREATE TABLE run_steps (
    run_id       bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step_index   integer NOT NULL,
    command      text NOT NULL,
    status       smallint NOT NULL DEFAULT 1,
    exit_code    integer,
    started_at   timestamptz,
    finished_at  timestamptz,
    PRIMARY KEY (run_id, step_index)
);

CREATE TABLE run_log_chunks (
    run_id       bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq          bigint NOT NULL,
    step_index   integer NOT NULL,
    text         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE artifacts (
    run_id       bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    path         text NOT NULL,
    step_index   integer NOT NULL,
    content      bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, path)
);

-- One row: the orchestrator's term, incremented each time a process becomes leader.
CREATE TABLE orchestrator_term (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    term        bigint NOT NULL DEFAULT 0,
    leader      text NOT NULL DEFAULT '',
    elected_at  timestamptz
);
INSERT INTO orchestrator_term DEFAULT VALUES;

CREATE TABLE queuer_workers (
    worker_id          text PRIMARY KEY,
    state              text NOT NULL DEFAULT 'alive' CHECK (state IN ('alive', 'dead')),
    registered_at      timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    jobs_owned         integer NOT NULL DEFAULT 0,
    owned_digest       bigint NOT NULL DEFAULT 0   -- XOR of the worker's (job_id, version) hashes, as it reports them
);

-- Live dispatchers: each upserts its row every few seconds (for `runplane status` and dashboards).
CREATE TABLE dispatchers (
    dispatcher_id  text PRIMARY KEY,
    cluster        text NOT NULL,
    launcher       text NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    dispatched     bigint NOT NULL DEFAULT 0   -- runs this process moved to starting
);

-- Which worker owns which job; 'pending' until the worker answers Claimed. No foreign key: when a
-- job row is deleted its ownership stays until the leader has told the owner to stop.
CREATE TABLE job_ownership (
    job_id        bigint PRIMARY KEY,
    worker_id     text,                 -- NULL while an Assign waits on the shared queue
    state         text NOT NULL CHECK (state IN ('pending', 'claimed')),
    term          bigint NOT NULL,
    clock         bigint NOT NULL,
    version       bigint NOT NULL,      -- job version the owner was last sent
    fires_after   bigint NOT NULL,      -- unix seconds: a new owner never queues a fire at or before it
    assigned_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_ownership_worker_idx ON job_ownership (worker_id);

-- Every change to a job or an account tells the orchestrator (LISTEN runplane_jobs).
CREATE FUNCTION runplane_notify_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('runplane_jobs', json_build_object('job_id', OLD.id, 'version', OLD.version + 1, 'op', 'delete')::text);
        RETURN OLD;
    END IF;
    PERFORM pg_notify('runplane_jobs', json_build_object('job_id', NEW.id, 'version', NEW.version, 'op', lower(TG_OP))::text);
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_notify_insert_delete AFTER INSERT OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION runplane_notify_job();
-- Only changes that matter to scheduling bump the version; the rest (failure counts) stay quiet.
CREATE TRIGGER jobs_notify_update AFTER UPDATE ON jobs
    FOR EACH ROW WHEN (OLD.version IS DISTINCT FROM NEW.version)
    EXECUTE FUNCTION runplane_notify_job();

CREATE FUNCTION runplane_notify_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runplane_accounts', json_build_object('account_id', NEW.id, 'op', lower(TG_OP))::text);
    RETURN NEW;
END $$;

CREATE TRIGGER accounts_notify AFTER INSERT OR UPDATE ON accounts
    FOR EACH ROW EXECUTE FUNCTION runplane_notify_account();
