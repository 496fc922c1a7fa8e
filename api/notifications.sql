-- Notifications of a run's end: their definitions (every door's), test messages and delivery log.

-- name: insert_notification
INSERT INTO notifications (account_id, user_id, type, external_email, slack_channel_id, slack_channel_name, secret,
                           secret_kind, on_success, on_warning, on_failure, on_cancel, state)
VALUES (%(account_id)s, %(user_id)s, %(type)s, %(external_email)s, %(slack_channel_id)s, %(slack_channel_name)s,
        %(secret)s, %(secret_kind)s, %(on_success)s, %(on_warning)s, %(on_failure)s, %(on_cancel)s, %(state)s)
RETURNING *;

-- name: update_notification
-- Saving a notification switches it back on: its count of failures starts again.
UPDATE notifications
   SET user_id = %(user_id)s, type = %(type)s, external_email = %(external_email)s,
       slack_channel_id = %(slack_channel_id)s, slack_channel_name = %(slack_channel_name)s,
       secret = CASE WHEN %(secret_kind)s = '' THEN secret ELSE %(secret)s END,
       secret_kind = CASE WHEN %(secret_kind)s = '' THEN secret_kind ELSE %(secret_kind)s END,
       on_success = %(on_success)s, on_warning = %(on_warning)s, on_failure = %(on_failure)s,
       on_cancel = %(on_cancel)s, state = %(state)s, consecutive_failures = 0, disabled_at = NULL,
       disabled_reason = '', updated_at = now()
 WHERE account_id = %(account_id)s AND id = %(id)s
RETURNING *;

-- name: list_notifications
SELECT * FROM notifications
 WHERE account_id = %(account_id)s AND (%(state)s::smallint IS NULL OR state = %(state)s)
   AND (%(job_id)s::bigint IS NULL OR %(job_id)s = ANY (on_success || on_warning || on_failure || on_cancel))
 ORDER BY id LIMIT %(limit)s OFFSET %(offset)s;

-- name: get_notification
SELECT * FROM notifications WHERE account_id = %(account_id)s AND id = %(id)s;

-- name: delete_notification
-- dbt Cloud deletes softly: state 2.
UPDATE notifications SET state = 2, updated_at = now() WHERE account_id = %(account_id)s AND id = %(id)s RETURNING *;

-- name: queue_test
-- A test message: an event like any other, on the same outbox, with no run.
INSERT INTO webhook_outbox (event_id, subscription_id, notification_id, account_id, event_type, payload)
VALUES (%(event_id)s, %(subscription_id)s, %(notification_id)s, %(account_id)s, %(event_type)s, %(payload)s)
RETURNING event_id;

-- name: notification_deliveries
SELECT o.id, o.event_id, o.event_type, o.run_id, o.created_at, o.attempts, o.delivered_at, o.abandoned_at,
       o.next_attempt_at, o.recipient, o.outcome,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'attempted_at', a.attempted_at, 'status_code', a.status_code,
                    'latency_ms', a.latency_ms, 'error', a.error, 'response_body', a.response_body) ORDER BY a.id)
                 FROM webhook_attempts a WHERE a.outbox_id = o.id), '[]'::jsonb) AS attempt_log
  FROM webhook_outbox o
 WHERE o.notification_id = %(id)s AND o.account_id = %(account_id)s
 ORDER BY o.id DESC
 LIMIT %(limit)s;
