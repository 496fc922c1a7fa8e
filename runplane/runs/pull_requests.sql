-- A pull request's CI runs and its schema (runplane/runs/pull_requests.py).

-- name: record_pull_request_schema
-- The schema is in use again (a pull request reopened after its schema was dropped included).
INSERT INTO pull_request_schemas (job_id, pull_request_number, account_id, schema_name, last_run_id)
VALUES (%(job_id)s, %(pull_request_number)s, %(account_id)s, %(schema_name)s, %(run_id)s)
ON CONFLICT (job_id, pull_request_number) DO UPDATE
   SET schema_name = EXCLUDED.schema_name, last_run_id = EXCLUDED.last_run_id, last_used_at = now(),
       drop_run_id = NULL

-- name: queue_schema_drop
-- A CI run of the job for the pull request whose one step drops the pull request's schema, unless
-- one is queued for this use of the schema already (a close delivered twice, a sweep racing a close
-- queue one) or the last one failed less than an hour ago. The key names the use and the drop before.
WITH target AS (
    SELECT p.job_id, p.pull_request_number, p.account_id, p.schema_name, p.last_run_id, p.drop_run_id, j.priority
      FROM pull_request_schemas p JOIN jobs j ON j.id = p.job_id
     WHERE p.job_id = %(job_id)s AND p.pull_request_number = %(pull_request_number)s AND j.deleted_at IS NULL
       AND (p.drop_run_id IS NULL OR EXISTS (
                SELECT 1 FROM runs d WHERE d.id = p.drop_run_id AND d.status IN (20, 30)
                   AND d.finished_at < now() - interval '1 hour'))
       FOR UPDATE OF p
), queued AS (
    INSERT INTO runs (account_id, job_id, job_type, trigger, cause, idempotency_key, priority, takes_slot,
                      overrides, pull_request_number, schema_name, scheduled_at)
    SELECT account_id, job_id, 'ci', 'ci', %(cause)s,
           'drop-schema:' || job_id || ':' || pull_request_number || ':' || last_run_id || ':'
               || coalesce(drop_run_id, 0),
           priority, false,
           jsonb_build_object('steps', jsonb_build_array(%(step)s::text),
                              'pull_request_number', pull_request_number, 'drop_schema', true),
           pull_request_number, schema_name, clock_timestamp()
      FROM target
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, account_id, job_id, pull_request_number, schema_name
)
UPDATE pull_request_schemas p SET drop_run_id = q.id
  FROM queued q
 WHERE p.job_id = q.job_id AND p.pull_request_number = q.pull_request_number
RETURNING q.id, q.account_id, q.job_id, q.pull_request_number, q.schema_name

-- name: schemas_of_pull_request
-- The CI jobs of the account that built a schema for this pull request (among job_ids, when given).
SELECT p.job_id FROM pull_request_schemas p JOIN jobs j ON j.id = p.job_id
 WHERE p.account_id = %(account_id)s AND p.pull_request_number = %(pull_request_number)s
   AND j.deleted_at IS NULL
   AND (cardinality(%(job_ids)b::bigint[]) = 0 OR p.job_id = ANY(%(job_ids)b::bigint[]))
 ORDER BY p.job_id

-- name: stale_pull_request_schemas
-- Schemas whose last CI run was queued longer ago than their account keeps them; oldest first.
SELECT p.job_id, p.pull_request_number FROM pull_request_schemas p JOIN accounts a ON a.id = p.account_id
 WHERE a.pull_request_schema_max_age_days > 0
   AND p.last_used_at < now() - make_interval(days => a.pull_request_schema_max_age_days)
   AND (p.drop_run_id IS NULL OR EXISTS (
            SELECT 1 FROM runs d WHERE d.id = p.drop_run_id AND d.status IN (20, 30)
               AND d.finished_at < now() - interval '1 hour'))
 ORDER BY p.last_used_at
 LIMIT %(limit)s
