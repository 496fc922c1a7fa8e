-- Commit statuses of pull requests' CI runs: where a project posts them, and their outbox.

-- name: put_commit_status_target
INSERT INTO project_commit_statuses (project_id, account_id, provider, repository, api_url, token)
VALUES (%(project_id)s, %(account_id)s, %(provider)s, %(repository)s, %(api_url)s, %(token)s)
ON CONFLICT (project_id) DO UPDATE
   SET provider = EXCLUDED.provider, repository = EXCLUDED.repository, api_url = EXCLUDED.api_url,
       token = coalesce(nullif(EXCLUDED.token, ''), project_commit_statuses.token), updated_at = now()
RETURNING project_id, account_id, provider, repository, api_url, token <> '' AS token_set, created_at, updated_at;

-- name: get_commit_status_target
SELECT project_id, account_id, provider, repository, api_url, token <> '' AS token_set, created_at, updated_at
  FROM project_commit_statuses
 WHERE account_id = %(account_id)s AND project_id = %(project_id)s;

-- name: delete_commit_status_target
DELETE FROM project_commit_statuses WHERE account_id = %(account_id)s AND project_id = %(project_id)s RETURNING project_id;

-- name: supersede_commit_statuses
-- A due state of a run that has a newer one is not sent: the provider would only show it for the
-- moment before the newer one. One in flight (leased) is left to finish first.
UPDATE commit_status_outbox o
   SET superseded_at = clock_timestamp()
 WHERE o.delivered_at IS NULL AND o.abandoned_at IS NULL AND o.superseded_at IS NULL
   AND o.next_attempt_at <= clock_timestamp()
   AND EXISTS (SELECT 1 FROM commit_status_outbox n WHERE n.run_id = o.run_id AND n.id > o.id);

-- name: claim_commit_statuses
-- Leases due states, the oldest unsent one of each run only: a run's states reach the provider in
-- the order they happened, never a pending after its success.
UPDATE commit_status_outbox o
   SET next_attempt_at = clock_timestamp() + make_interval(secs => %(lease)s), attempts = o.attempts + 1
  FROM project_commit_statuses t
 WHERE t.project_id = o.project_id
   AND o.id IN (SELECT c.id FROM commit_status_outbox c
                 WHERE c.delivered_at IS NULL AND c.abandoned_at IS NULL AND c.superseded_at IS NULL
                   AND c.next_attempt_at <= clock_timestamp()
                   AND NOT EXISTS (SELECT 1 FROM commit_status_outbox p
                                    WHERE p.run_id = c.run_id AND p.id < c.id
                                      AND p.delivered_at IS NULL AND p.abandoned_at IS NULL
                                      AND p.superseded_at IS NULL)
                 ORDER BY c.next_attempt_at, c.id
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
RETURNING o.id, o.run_id, o.sha, o.state, o.description, o.context, o.attempts,
          t.provider, t.repository, t.api_url, t.token;

-- name: record_commit_status_attempt
UPDATE commit_status_outbox
   SET delivered_at = CASE WHEN %(delivered)s THEN clock_timestamp() END,
       abandoned_at = CASE WHEN NOT %(delivered)s AND attempts >= %(max_attempts)s THEN clock_timestamp() END,
       next_attempt_at = clock_timestamp() + make_interval(secs => %(retry_after)s),
       last_status_code = %(status_code)s, last_error = %(error)s
 WHERE id = %(id)s;

-- name: commit_statuses_of_run
SELECT id, run_id, sha, state, description, context, attempts, last_status_code, last_error,
       delivered_at, abandoned_at, superseded_at
  FROM commit_status_outbox
 WHERE account_id = %(account_id)s AND run_id = %(run_id)s
 ORDER BY id;
