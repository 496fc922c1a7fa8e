-- Outgoing webhooks: subscriptions (the REST API's v3 webhook calls) and the delivery worker.

-- name: insert_subscription
INSERT INTO webhook_subscriptions (id, account_id, name, description, client_url, event_types, job_ids, active, hmac_secret)
VALUES (%(id)s, %(account_id)s, %(name)s, %(description)s, %(client_url)s, %(event_types)s, %(job_ids)s, %(active)s,
        %(hmac_secret)s)
RETURNING *;

-- name: list_subscriptions
SELECT * FROM webhook_subscriptions WHERE account_id = %(account_id)s ORDER BY created_at, id;

-- name: get_subscription
SELECT * FROM webhook_subscriptions WHERE account_id = %(account_id)s AND id = %(id)s;

-- name: update_subscription
-- Saving a subscription active switches it back on: its count of failures starts again.
UPDATE webhook_subscriptions
   SET name = %(name)s, description = %(description)s, client_url = %(client_url)s, event_types = %(event_types)s,
       job_ids = %(job_ids)s, active = %(active)s, updated_at = now(),
       consecutive_failures = CASE WHEN %(active)s THEN 0 ELSE consecutive_failures END,
       disabled_at = CASE WHEN %(active)s THEN NULL ELSE disabled_at END,
       disabled_reason = CASE WHEN %(active)s THEN '' ELSE disabled_reason END
 WHERE account_id = %(account_id)s AND id = %(id)s
RETURNING *;

-- name: delete_subscription
DELETE FROM webhook_subscriptions WHERE account_id = %(account_id)s AND id = %(id)s RETURNING id;

-- name: deliveries
SELECT o.id, o.event_id, o.event_type, o.run_id, o.created_at, o.attempts, o.delivered_at, o.abandoned_at,
       o.next_attempt_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'attempted_at', a.attempted_at, 'status_code', a.status_code,
                    'latency_ms', a.latency_ms, 'error', a.error, 'response_body', a.response_body) ORDER BY a.id)
                 FROM webhook_attempts a WHERE a.outbox_id = o.id), '[]'::jsonb) AS attempt_log
  FROM webhook_outbox o
 WHERE o.subscription_id = %(id)s AND o.account_id = %(account_id)s
 ORDER BY o.id DESC
 LIMIT %(limit)s;

-- name: claim_deliveries
-- Leases due events of receivers still on: a worker that dies mid-delivery leaves them to be claimed
-- again after the lease (then `sending_at` says whether it was cut off mid-send).
UPDATE webhook_outbox o
   SET next_attempt_at = clock_timestamp() + make_interval(secs => %(lease)s), attempts = o.attempts + 1
 WHERE o.id IN (SELECT x.id FROM webhook_outbox x
                  LEFT JOIN webhook_subscriptions s ON s.id = x.subscription_id
                  LEFT JOIN notifications n ON n.id = x.notification_id
                 WHERE x.delivered_at IS NULL AND x.abandoned_at IS NULL AND x.next_attempt_at <= clock_timestamp()
                   AND (s.disabled_at IS NULL AND n.disabled_at IS NULL)
                 ORDER BY x.next_attempt_at, x.id
                 LIMIT %(limit)s
                 FOR UPDATE OF x SKIP LOCKED)
RETURNING o.id, o.event_id, o.event_type, o.payload, o.attempts, o.run_id, o.account_id, o.subscription_id,
          o.notification_id, o.recipient, o.sending_at,
          (SELECT s.client_url FROM webhook_subscriptions s WHERE s.id = o.subscription_id) AS client_url,
          (SELECT s.hmac_secret FROM webhook_subscriptions s WHERE s.id = o.subscription_id) AS hmac_secret;

-- name: mark_sending
-- Committed just before a message leaves: a claim that finds it set knows the send was cut off.
UPDATE webhook_outbox SET sending_at = clock_timestamp() WHERE id = %(id)s;

-- name: record_attempt
-- One attempt's result, and the receiver's count of failures in a row: the `switch_off_after`-th
-- switches the receiver off (its undelivered events are abandoned with it); a success resets it.
WITH attempt AS (
    INSERT INTO webhook_attempts (outbox_id, status_code, latency_ms, error, response_body)
    VALUES (%(id)s, %(status_code)s, %(latency_ms)s, %(error)s, %(response_body)s)
), event AS (
    UPDATE webhook_outbox
       SET delivered_at = CASE WHEN %(delivered)s THEN clock_timestamp() END,
           abandoned_at = CASE WHEN NOT %(delivered)s AND (attempts >= %(max_attempts)s OR %(give_up)s)
                               THEN clock_timestamp() END,
           next_attempt_at = clock_timestamp() + make_interval(secs => %(retry_after)s),
           sending_at = NULL,
           outcome = %(outcome)s
     WHERE id = %(id)s
    RETURNING subscription_id, notification_id
), subscription AS (
    UPDATE webhook_subscriptions s
       SET consecutive_failures = CASE WHEN %(delivered)s THEN 0 ELSE s.consecutive_failures + 1 END,
           disabled_at = CASE WHEN NOT %(delivered)s AND s.consecutive_failures + 1 >= %(switch_off_after)s
                              THEN clock_timestamp() ELSE s.disabled_at END,
           disabled_reason = CASE WHEN NOT %(delivered)s AND s.consecutive_failures + 1 >= %(switch_off_after)s
                                  THEN %(switch_off_reason)s ELSE s.disabled_reason END,
           active = s.active AND NOT (NOT %(delivered)s AND s.consecutive_failures + 1 >= %(switch_off_after)s)
      FROM event e
     WHERE s.id = e.subscription_id AND %(counts)s
)
UPDATE notifications n
   SET consecutive_failures = CASE WHEN %(delivered)s THEN 0 ELSE n.consecutive_failures + 1 END,
       disabled_at = CASE WHEN NOT %(delivered)s AND n.consecutive_failures + 1 >= %(switch_off_after)s
                          THEN clock_timestamp() ELSE n.disabled_at END,
       disabled_reason = CASE WHEN NOT %(delivered)s AND n.consecutive_failures + 1 >= %(switch_off_after)s
                              THEN %(switch_off_reason)s ELSE n.disabled_reason END
  FROM event e
 WHERE n.id = e.notification_id AND %(counts)s;

-- name: abandon_switched_off
-- The undelivered events of receivers switched off: kept, visible, never sent.
UPDATE webhook_outbox o
   SET abandoned_at = clock_timestamp(), outcome = 'receiver switched off'
  FROM webhook_outbox x
  LEFT JOIN webhook_subscriptions s ON s.id = x.subscription_id
  LEFT JOIN notifications n ON n.id = x.notification_id
 WHERE o.id = x.id AND x.delivered_at IS NULL AND x.abandoned_at IS NULL
   AND (s.disabled_at IS NOT NULL OR n.disabled_at IS NOT NULL);

-- name: insert_git_webhook
INSERT INTO git_webhooks (account_id, provider, repository, secret, job_ids)
VALUES (%(account_id)s, %(provider)s, %(repository)s, %(secret)s, %(job_ids)s)
ON CONFLICT (account_id, provider, repository) DO UPDATE SET secret = EXCLUDED.secret, job_ids = EXCLUDED.job_ids
RETURNING *;

-- name: get_git_webhook
SELECT * FROM git_webhooks WHERE id = %(id)s AND provider = %(provider)s;

-- name: ci_jobs_for_closed_pull_request
-- The account's CI jobs (of this hook's list, when it has one) whose schemas a closed pull request
-- leaves behind: any CI job, paused or not, triggered by the hook or over the API.
SELECT j.id, p.repository_url
  FROM jobs j
  LEFT JOIN environments e ON e.id = j.environment_id
  LEFT JOIN projects p ON p.id = e.project_id
 WHERE j.account_id = %(account_id)s AND j.deleted_at IS NULL AND j.job_type = 'ci'
   AND (cardinality(%(job_ids)b::bigint[]) = 0 OR j.id = ANY(%(job_ids)b::bigint[]))
 ORDER BY j.id;

-- name: jobs_for_git_event
-- The account's live jobs that a pull request (ci) or a merge (merge) of this hook may start (not
-- paused), with the repository of their project (NULL for a job of plain commands, which has none).
SELECT j.id, p.repository_url
  FROM jobs j
  LEFT JOIN environments e ON e.id = j.environment_id
  LEFT JOIN projects p ON p.id = e.project_id
 WHERE j.account_id = %(account_id)s AND j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL
   AND ((%(kind)s = 'ci' AND j.job_type = 'ci' AND j.on_pull_request)
        OR (%(kind)s = 'merge' AND j.job_type = 'merge' AND j.on_merge))
   AND (cardinality(%(job_ids)b::bigint[]) = 0 OR j.id = ANY(%(job_ids)b::bigint[]))
 ORDER BY j.id;

-- name: skip_event
-- An event a notification does not want after all (a success that turned out a warning, or the
-- reverse): closed without a message.
UPDATE webhook_outbox SET delivered_at = clock_timestamp(), sending_at = NULL, outcome = %(outcome)s WHERE id = %(id)s;

-- name: run_summary
-- What a notification of a run's end says about the run.
SELECT r.id, r.account_id, r.job_id, r.status, r.status_message, r.started_at, r.finished_at, r.queued_at,
       j.name AS job_name, coalesce(e.name, '') AS environment_name, coalesce(p.name, '') AS project_name
  FROM runs r
  JOIN jobs j ON j.id = r.job_id
  LEFT JOIN environments e ON e.id = j.environment_id
  LEFT JOIN projects p ON p.id = e.project_id
 WHERE r.id = %(run_id)s;

-- name: failing_step
-- The first step of a run that did not end well, with its log.
SELECT s.step_index, s.command, s.exit_code,
       coalesce((SELECT string_agg(c.text, '' ORDER BY c.seq) FROM run_log_chunks c
                  WHERE c.run_id = s.run_id AND c.step_index = s.step_index), '') AS log
  FROM run_steps s
 WHERE s.run_id = %(run_id)s AND (s.status = 20 OR coalesce(s.exit_code, 0) <> 0)
 ORDER BY s.step_index
 LIMIT 1;

-- name: run_artifacts
-- Every step's copy of one artifact of a run, in step order.
SELECT content FROM artifacts WHERE run_id = %(run_id)s AND path = %(path)s ORDER BY step_index;

-- name: insert_owner_events
-- A models' owners notification fans out into one event per owner; the unique index keeps it one per
-- owner and run, however often this runs.
INSERT INTO webhook_outbox (event_id, notification_id, account_id, event_type, run_id, payload, recipient)
SELECT 'ntf_' || replace(gen_random_uuid()::text, '-', ''), %(notification_id)s, %(account_id)s,
       'job.run.owner_notification', %(run_id)s, %(payload)s, owner
  FROM unnest(%(owners)b::text[]) AS owner
ON CONFLICT DO NOTHING;

-- name: subscription_events
-- A subscription's events as dbt Cloud lists them, with the last answer's status code.
SELECT o.event_id AS id, o.subscription_id, o.account_id, o.event_type, o.payload, o.run_id, o.created_at,
       (o.payload -> 'data' ->> 'jobId') AS job_id,
       (SELECT a.status_code FROM webhook_attempts a WHERE a.outbox_id = o.id ORDER BY a.id DESC LIMIT 1) AS status_code
  FROM webhook_outbox o
 WHERE o.subscription_id = %(id)s AND o.account_id = %(account_id)s
 ORDER BY o.id DESC
 LIMIT %(limit)s OFFSET %(offset)s;

-- name: event_receipts
-- The receipts (attempts) of one event of a subscription.
SELECT a.id, o.event_id, o.subscription_id, a.attempted_at, a.status_code, a.error, a.response_body, o.payload
  FROM webhook_attempts a
  JOIN webhook_outbox o ON o.id = a.outbox_id
 WHERE o.account_id = %(account_id)s AND o.subscription_id = %(id)s AND o.event_id = %(event_id)s
 ORDER BY a.id;
