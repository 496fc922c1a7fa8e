-- Fan-in (all-of completion triggers): runplane/runs/fan_in.py.

-- name: fan_in_jobs
-- The all-of jobs this outcome counts for, locked in id order: the checks of one job run one after
-- the other, each seeing the upstream runs the ones before it committed.
SELECT j.id
  FROM job_completion_triggers t
  JOIN jobs j ON j.id = t.job_id
 WHERE t.upstream_job_id = %(upstream_job_id)s AND %(status)s::smallint = ANY(t.statuses)
   AND j.completion_mode = 'all'
   AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.deleted_at IS NULL
 ORDER BY j.id
   FOR UPDATE OF j

-- name: fan_in_set
-- Per upstream job of the all-of job: its newest run with a counted status not counted yet (NULL:
-- none since the last set).
SELECT t.upstream_job_id,
       (SELECT max(r.id) FROM runs r
         WHERE r.job_id = t.upstream_job_id AND r.status = ANY(t.statuses)
           AND r.id > coalesce(c.last_run_id, 0)) AS run_id
  FROM job_completion_triggers t
  LEFT JOIN completion_consumed c ON c.job_id = t.job_id AND c.upstream_job_id = t.upstream_job_id
 WHERE t.job_id = %(job_id)s
 ORDER BY t.upstream_job_id

-- name: queue_fan_in
INSERT INTO runs (account_id, job_id, job_type, trigger, cause, idempotency_key, upstream_run_id,
                  priority, takes_slot, scheduled_at)
SELECT j.account_id, j.id, j.job_type, 'completion', %(cause)s, %(key)s, %(run_id)s, j.priority,
       j.job_type <> 'ci', clock_timestamp()
  FROM jobs j
 WHERE j.id = %(job_id)s
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, account_id

-- name: consume_fan_in
INSERT INTO completion_consumed (job_id, upstream_job_id, last_run_id)
SELECT %(job_id)s, s.upstream_job_id, s.run_id
  FROM unnest(%(upstream_job_ids)b::bigint[], %(run_ids)b::bigint[]) AS s (upstream_job_id, run_id)
ON CONFLICT (job_id, upstream_job_id) DO UPDATE SET last_run_id = EXCLUDED.last_run_id
