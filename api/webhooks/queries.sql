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
UPDATE webhook_subscriptions
   SET name = %(name)s, description = %(description)s, client_url = %(client_url)s, event_types = %(event_types)s,
       job_ids = %(job_ids)s, active = %(active)s, updated_at = now()
 WHERE account_id = %(account_id)s AND id = %(id)s
RETURNING *;

-- name: delete_subscription
DELETE FROM webhook_subscriptions WHERE account_id = %(account_id)s AND id = %(id)s RETURNING id;

-- name: deliveries
SELECT o.id, o.event_id, o.event_type, o.run_id, o.created_at, o.attempts, o.delivered_at, o.abandoned_at,
       o.next_attempt_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'attempted_at', a.attempted_at, 'status_code', a.status_code,
                    'latency_ms', a.latency_ms, 'error', a.error) ORDER BY a.id)
                 FROM webhook_attempts a WHERE a.outbox_id = o.id), '[]'::jsonb) AS attempt_log
  FROM webhook_outbox o
 WHERE o.subscription_id = %(id)s AND o.account_id = %(account_id)s
 ORDER BY o.id DESC
 LIMIT %(limit)s;

-- name: claim_deliveries
-- Leases due events: a worker that dies mid-delivery leaves them to be sent again after the lease.
UPDATE webhook_outbox o
   SET next_attempt_at = clock_timestamp() + make_interval(secs => %(lease)s), attempts = o.attempts + 1
  FROM webhook_subscriptions s
 WHERE s.id = o.subscription_id
   AND o.id IN (SELECT id FROM webhook_outbox
                 WHERE delivered_at IS NULL AND abandoned_at IS NULL AND next_attempt_at <= clock_timestamp()
                 ORDER BY next_attempt_at, id
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
RETURNING o.id, o.event_id, o.payload, o.attempts, s.client_url, s.hmac_secret;

-- name: record_attempt
WITH attempt AS (
    INSERT INTO webhook_attempts (outbox_id, status_code, latency_ms, error)
    VALUES (%(id)s, %(status_code)s, %(latency_ms)s, %(error)s)
)
UPDATE webhook_outbox
   SET delivered_at = CASE WHEN %(delivered)s THEN clock_timestamp() END,
       abandoned_at = CASE WHEN NOT %(delivered)s AND attempts >= %(max_attempts)s THEN clock_timestamp() END,
       next_attempt_at = clock_timestamp() + make_interval(secs => %(retry_after)s)
 WHERE id = %(id)s;

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
