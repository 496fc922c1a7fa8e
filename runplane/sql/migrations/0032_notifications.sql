-- Notifications of a run's end (email, Slack, Microsoft Teams, and the owners of the project's models),
-- in dbt Cloud's v2 shape: a receiver with the jobs it hears about per outcome. They leave through the
-- webhooks' outbox: one outbox, one claim, one backoff, two kinds of receiver.

CREATE TABLE notifications (
    id                    bigserial PRIMARY KEY,
    account_id            bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    user_id               bigint NOT NULL DEFAULT 0,
    -- dbt Cloud's types: 2 Slack, 4 external email; runplane's: 6 Microsoft Teams, 7 the models' owners.
    type                  smallint NOT NULL CHECK (type IN (2, 4, 6, 7)),
    external_email        text NOT NULL DEFAULT '',
    slack_channel_id      text NOT NULL DEFAULT '',
    slack_channel_name    text NOT NULL DEFAULT '',
    secret                text NOT NULL DEFAULT '',   -- Fernet token: a Slack or Teams URL, or a Slack bot token
    secret_kind           text NOT NULL DEFAULT ''    -- which of those: slack_webhook_url, slack_bot_token, teams_webhook_url
                          CHECK (secret_kind IN ('', 'slack_webhook_url', 'slack_bot_token', 'teams_webhook_url')),
    on_success            bigint[] NOT NULL DEFAULT '{}',
    on_warning            bigint[] NOT NULL DEFAULT '{}',
    on_failure            bigint[] NOT NULL DEFAULT '{}',
    on_cancel             bigint[] NOT NULL DEFAULT '{}',
    state                 smallint NOT NULL DEFAULT 1 CHECK (state IN (1, 2)),
    consecutive_failures  integer NOT NULL DEFAULT 0,
    disabled_at           timestamptz,                -- switched off after failures in a row
    disabled_reason       text NOT NULL DEFAULT '',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notifications_account_idx ON notifications (account_id) WHERE state = 1;

-- Webhook subscriptions are switched off the same way.
ALTER TABLE webhook_subscriptions
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN disabled_at timestamptz,
    ADD COLUMN disabled_reason text NOT NULL DEFAULT '';

-- An outbox row is for a subscription or for a notification. `recipient` names one owner for a
-- models' owners notification (empty otherwise). `sending_at` is set, committed, just before a message
-- leaves and cleared with the attempt's result: a row claimed again while it is set was cut off
-- mid-send, and whether the receiver has it is in doubt.
ALTER TABLE webhook_outbox
    ALTER COLUMN subscription_id DROP NOT NULL,
    ADD COLUMN notification_id bigint REFERENCES notifications (id) ON DELETE CASCADE,
    ADD COLUMN recipient text NOT NULL DEFAULT '',
    ADD COLUMN sending_at timestamptz,
    ADD COLUMN outcome text NOT NULL DEFAULT '',
    ADD CONSTRAINT webhook_outbox_one_receiver CHECK (num_nonnulls(subscription_id, notification_id) = 1);
-- One message per run, notification and recipient, whoever writes it and however often.
CREATE UNIQUE INDEX webhook_outbox_notification_once ON webhook_outbox (notification_id, run_id, recipient)
    WHERE notification_id IS NOT NULL AND run_id IS NOT NULL;
CREATE INDEX webhook_outbox_notification_idx ON webhook_outbox (notification_id, id DESC)
    WHERE notification_id IS NOT NULL;

-- What the receiver answered, for the delivery log (cut to a few kilobytes).
ALTER TABLE webhook_attempts ADD COLUMN response_body text NOT NULL DEFAULT '';

-- A run's end queues one outbox row per notification that hears about its job for that status; a
-- success is a warning when its results say so, which the sender reads from run_results.json.
CREATE FUNCTION runplane_notification_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_outbox (event_id, notification_id, account_id, event_type, run_id, payload)
    SELECT 'ntf_' || replace(gen_random_uuid()::text, '-', ''), n.id, NEW.account_id, 'job.run.notification',
           NEW.id, jsonb_build_object('runId', NEW.id, 'runStatusCode', NEW.status)
      FROM notifications n
     WHERE n.account_id = NEW.account_id AND n.state = 1 AND n.disabled_at IS NULL
       AND CASE NEW.status WHEN 10 THEN NEW.job_id = ANY (n.on_success) OR NEW.job_id = ANY (n.on_warning)
                           WHEN 20 THEN NEW.job_id = ANY (n.on_failure)
                           WHEN 30 THEN NEW.job_id = ANY (n.on_cancel) END
    ON CONFLICT DO NOTHING;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_notification_events AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN (10, 20, 30))
    EXECUTE FUNCTION runplane_notification_events();
