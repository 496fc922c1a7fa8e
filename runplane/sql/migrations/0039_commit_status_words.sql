-- A CI run's commit status, its words in a variable no table column shares a name with: once
-- environments had a description column too, the trigger's `description` was ambiguous and every
-- insert of a CI run with a commit status to post failed.
CREATE OR REPLACE FUNCTION runplane_commit_status_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    state text;
    said text;
BEGIN
    -- A pull request's CI run at a known commit: from a Git webhook or over the API.
    IF NEW.job_type <> 'ci' OR NEW.pull_request_number IS NULL OR coalesce(NEW.overrides ->> 'git_sha', '') = '' THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM project_commit_statuses WHERE account_id = NEW.account_id) THEN
        RETURN NEW;
    END IF;
    CASE NEW.status
        WHEN 1 THEN state := 'queued'; said := 'Queued';
        WHEN 3 THEN state := 'running'; said := 'Running';
        WHEN 10 THEN state := 'success'; said := 'Succeeded';
        WHEN 20 THEN state := 'failure'; said := 'Failed';
        WHEN 30 THEN state := 'cancelled'; said := 'Cancelled';
        ELSE RETURN NEW;  -- starting: still pending, nothing new to say
    END CASE;
    IF NEW.status IN (20, 30) AND NEW.status_message <> '' THEN
        said := said || ': ' || NEW.status_message;
    END IF;
    INSERT INTO commit_status_outbox (account_id, run_id, project_id, sha, state, description, context)
    SELECT NEW.account_id, NEW.id, cs.project_id, NEW.overrides ->> 'git_sha', state,
           left(format('Run #%s %s', NEW.id, said), 140), left('runplane/' || j.name, 255)
      FROM jobs j
      JOIN environments e ON e.id = j.environment_id
      JOIN project_commit_statuses cs ON cs.project_id = e.project_id
     WHERE j.id = NEW.job_id
       AND coalesce(NEW.overrides ->> 'pull_request_provider', cs.provider) = cs.provider;
    RETURN NEW;
END
$$;
