-- Outgoing webhooks in dbt Cloud's format: subscriptions per account, an outbox filled by a trigger
-- on runs.status (so every status change and its events commit together, whichever code made the
-- change), and every delivery attempt.

CREATE TABLE webhook_subscriptions (
    id           text PRIMARY KEY,                   -- wsu_..., as dbt Cloud names them
    account_id   bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    description  text NOT NULL DEFAULT '',
    client_url   text NOT NULL,
    event_types  text[] NOT NULL CHECK (cardinality(event_types) >= 1),
    job_ids      bigint[] NOT NULL DEFAULT '{}',      -- empty: every job of the account
    active       boolean NOT NULL DEFAULT true,
    hmac_secret  text NOT NULL,                       -- Fernet token: encrypted at rest
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_subscriptions_account_idx ON webhook_subscriptions (account_id) WHERE active;

CREATE TABLE webhook_outbox (
    id               bigserial PRIMARY KEY,
    event_id         text NOT NULL UNIQUE,            -- wev_...: the same on every attempt
    subscription_id  text NOT NULL REFERENCES webhook_subscriptions (id) ON DELETE CASCADE,
    account_id       bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    event_type       text NOT NULL,
    run_id           bigint REFERENCES runs (id) ON DELETE SET NULL,
    payload          jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts         integer NOT NULL DEFAULT 0,
    delivered_at     timestamptz,
    abandoned_at     timestamptz                      -- gave up after the last allowed attempt
);
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (next_attempt_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL;
CREATE INDEX webhook_outbox_subscription_idx ON webhook_outbox (subscription_id, id DESC);

CREATE TABLE webhook_attempts (
    id            bigserial PRIMARY KEY,
    outbox_id     bigint NOT NULL REFERENCES webhook_outbox (id) ON DELETE CASCADE,
    attempted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    status_code   integer,                            -- NULL: no HTTP answer (refused, timeout)
    latency_ms    double precision NOT NULL,
    error         text NOT NULL DEFAULT ''
);
CREATE INDEX webhook_attempts_outbox_idx ON webhook_attempts (outbox_id, id);

CREATE FUNCTION runplane_iso(ts timestamptz) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;

CREATE FUNCTION runplane_webhook_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    events text[];
BEGIN
    IF NEW.status = 3 THEN
        events := ARRAY['job.run.started'];
    ELSIF NEW.status = 20 THEN
        events := ARRAY['job.run.errored', 'job.run.completed'];
    ELSIF NEW.status IN (10, 30) THEN
        events := ARRAY['job.run.completed'];
    ELSE
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE account_id = NEW.account_id AND active) THEN
        RETURN NEW;
    END IF;
    INSERT INTO webhook_outbox (event_id, subscription_id, account_id, event_type, run_id, payload)
    SELECT e.event_id, s.id, NEW.account_id, ev.event_type, NEW.id, jsonb_build_object(
        'accountId', NEW.account_id,
        'webhooksID', s.id,
        'eventId', e.event_id,
        'timestamp', runplane_iso(clock_timestamp()),
        'eventType', ev.event_type,
        'webhookName', s.name,
        'data', jsonb_strip_nulls(jsonb_build_object(
            'jobId', NEW.job_id::text,
            'jobName', j.name,
            'runId', NEW.id::text,
            'runStatus', CASE NEW.status WHEN 3 THEN 'Running' WHEN 10 THEN 'Success'
                                         WHEN 20 THEN 'Errored' WHEN 30 THEN 'Cancelled' END,
            'runStatusCode', NEW.status,
            'runStatusMessage', NULLIF(NEW.status_message, ''),
            'runReason', NEW.cause,
            'runStartedAt', runplane_iso(NEW.started_at),
            'runFinishedAt', CASE WHEN NEW.status IN (10, 20, 30) THEN runplane_iso(NEW.finished_at) END,
            'runErroredAt', CASE WHEN ev.event_type = 'job.run.errored' THEN runplane_iso(NEW.finished_at) END
        ))
    )
    FROM webhook_subscriptions s
    JOIN jobs j ON j.id = NEW.job_id
    CROSS JOIN LATERAL unnest(events) AS ev (event_type)
    CROSS JOIN LATERAL (SELECT 'wev_' || replace(gen_random_uuid()::text, '-', '') AS event_id, ev.event_type AS t) e
    WHERE s.account_id = NEW.account_id AND s.active AND ev.event_type = ANY (s.event_types)
      AND (cardinality(s.job_ids) = 0 OR NEW.job_id = ANY (s.job_ids));
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_webhook_events AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION runplane_webhook_events();

-- Git webhooks in: a pull/merge request of this repository starts the account's CI jobs (and its
-- merge jobs when merged). Until projects carry their repository, the repository is named here,
-- optionally limited to some jobs.
CREATE TABLE git_webhooks (
    id          bigserial PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    provider    text NOT NULL CHECK (provider IN ('github', 'gitlab')),
    repository  text NOT NULL,                       -- owner/name, or GitLab's path_with_namespace
    secret      text NOT NULL,                       -- Fernet token: encrypted at rest
    job_ids     bigint[] NOT NULL DEFAULT '{}',      -- empty: every CI / merge job of the account
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, provider, repository)
);
