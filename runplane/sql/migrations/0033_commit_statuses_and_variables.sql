-- Pull requests' commit statuses: a CI run reports its state (pending while queued and running,
-- then success, failure or cancelled, linked to its page) to the Git provider its pull request
-- lives on. Where to post and the provider's token are a project's (the token a Fernet token,
-- never returned); the outbox is filled by a trigger on runs, in the transaction that queues the
-- run or changes its status, whichever code path did it, and sent at least once by the API's
-- delivery task.

CREATE TABLE project_commit_statuses (
    project_id   bigint PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    account_id   bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    provider     text NOT NULL CHECK (provider IN ('github', 'gitlab')),
    repository   text NOT NULL CHECK (length(repository) BETWEEN 1 AND 300),  -- owner/name, or GitLab's project id or path
    api_url      text NOT NULL,                                              -- https://api.github.com, https://gitlab.com/api/v4, ...
    token        text NOT NULL,                                              -- Fernet token: encrypted at rest
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX project_commit_statuses_account_idx ON project_commit_statuses (account_id);

CREATE TABLE commit_status_outbox (
    id               bigserial PRIMARY KEY,
    account_id       bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    run_id           bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    project_id       bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sha              text NOT NULL,
    state            text NOT NULL CHECK (state IN ('queued', 'running', 'success', 'failure', 'cancelled')),
    description      text NOT NULL,
    context          text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts         integer NOT NULL DEFAULT 0,
    last_status_code integer,
    last_error       text NOT NULL DEFAULT '',
    delivered_at     timestamptz,
    abandoned_at     timestamptz,                      -- gave up after the last allowed attempt
    superseded_at    timestamptz                       -- a newer state of its run was due: not sent
);
CREATE INDEX commit_status_outbox_due_idx ON commit_status_outbox (next_attempt_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL AND superseded_at IS NULL;
CREATE INDEX commit_status_outbox_run_idx ON commit_status_outbox (run_id, id);

CREATE FUNCTION runplane_commit_status_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    state text;
    description text;
BEGIN
    -- A pull request's CI run at a known commit: from a Git webhook or over the API.
    IF NEW.job_type <> 'ci' OR NEW.pull_request_number IS NULL OR coalesce(NEW.overrides ->> 'git_sha', '') = '' THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM project_commit_statuses WHERE account_id = NEW.account_id) THEN
        RETURN NEW;
    END IF;
    CASE NEW.status
        WHEN 1 THEN state := 'queued'; description := 'Queued';
        WHEN 3 THEN state := 'running'; description := 'Running';
        WHEN 10 THEN state := 'success'; description := 'Succeeded';
        WHEN 20 THEN state := 'failure'; description := 'Failed';
        WHEN 30 THEN state := 'cancelled'; description := 'Cancelled';
        ELSE RETURN NEW;  -- starting: still pending, nothing new to say
    END CASE;
    IF NEW.status IN (20, 30) AND NEW.status_message <> '' THEN
        description := description || ': ' || NEW.status_message;
    END IF;
    INSERT INTO commit_status_outbox (account_id, run_id, project_id, sha, state, description, context)
    SELECT NEW.account_id, NEW.id, cs.project_id, NEW.overrides ->> 'git_sha', state,
           left(format('Run #%s %s', NEW.id, description), 140), left('runplane/' || j.name, 255)
      FROM jobs j
      JOIN environments e ON e.id = j.environment_id
      JOIN project_commit_statuses cs ON cs.project_id = e.project_id
     WHERE j.id = NEW.job_id
       AND coalesce(NEW.overrides ->> 'pull_request_provider', cs.provider) = cs.provider;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_commit_status_queued AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION runplane_commit_status_events();
CREATE TRIGGER runs_commit_status_changed AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION runplane_commit_status_events();

-- Environment variables as dbt Cloud's v3 API names them: a project default, a value per
-- environment, an override per job, each with an id. The values stay where runs read them
-- (environments.variables / secret_variables, jobs.environment / secret_environment); project
-- defaults are kept here (a secret one as a Fernet token). An id is given to a name at a level the
-- first time the API shows or sets it, and stays that name's at that level.
CREATE TABLE project_variables (
    project_id  bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        text NOT NULL,
    value       text NOT NULL,                       -- a Fernet token when secret
    secret      boolean NOT NULL,
    PRIMARY KEY (project_id, name)
);

CREATE TABLE environment_variable_ids (
    id          bigserial PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    project_id  bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        text NOT NULL,
    level       text NOT NULL CHECK (level IN ('project', 'environment', 'job')),
    scope_id    bigint NOT NULL DEFAULT 0,           -- the environment's or the job's id; 0 for the project
    UNIQUE (project_id, name, level, scope_id)
);
