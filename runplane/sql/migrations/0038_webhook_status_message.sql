-- Every run event carries `runStatusMessage`, as dbt Cloud's documented payloads do: the run's
-- status message, or the string "None" (what dbt Cloud sends) while there is none, as for a run
-- that has just started or has succeeded.
CREATE OR REPLACE FUNCTION runplane_webhook_events() RETURNS trigger LANGUAGE plpgsql AS $$
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
        'webhookId', s.id,
        'webhooksID', s.id,
        'eventId', e.event_id,
        'timestamp', runplane_iso(clock_timestamp()),
        'eventType', ev.event_type,
        'webhookName', s.name,
        'data', jsonb_strip_nulls(jsonb_build_object(
            'jobId', NEW.job_id::text,
            'jobName', j.name,
            'runId', NEW.id::text,
            'environmentId', env.id::text,
            'environmentName', env.name,
            'dbtVersion', COALESCE(NEW.overrides ->> 'dbt_version', env.dbt_version),
            'projectName', p.name,
            'projectId', p.id::text,
            'runStatus', CASE NEW.status WHEN 3 THEN 'Running' WHEN 10 THEN 'Success'
                                         WHEN 20 THEN 'Errored' WHEN 30 THEN 'Cancelled' END,
            'runStatusCode', NEW.status,
            'runStatusMessage', COALESCE(NULLIF(NEW.status_message, ''), 'None'),
            'runReason', NEW.cause,
            'runStartedAt', runplane_iso(NEW.started_at),
            'runFinishedAt', CASE WHEN NEW.status IN (10, 20, 30) THEN runplane_iso(NEW.finished_at) END,
            'runErroredAt', CASE WHEN ev.event_type = 'job.run.errored' THEN runplane_iso(NEW.finished_at) END
        ))
    )
    FROM webhook_subscriptions s
    JOIN jobs j ON j.id = NEW.job_id
    LEFT JOIN environments env ON env.id = j.environment_id
    LEFT JOIN projects p ON p.id = env.project_id
    CROSS JOIN LATERAL unnest(events) AS ev (event_type)
    CROSS JOIN LATERAL (SELECT 'wev_' || replace(gen_random_uuid()::text, '-', '') AS event_id, ev.event_type AS t) e
    WHERE s.account_id = NEW.account_id AND s.active AND ev.event_type = ANY (s.event_types)
      AND (cardinality(s.job_ids) = 0 OR NEW.job_id = ANY (s.job_ids));
    RETURN NEW;
END
$$;
