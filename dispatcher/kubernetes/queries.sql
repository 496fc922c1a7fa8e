-- Reconciling run Pods with their runs (the kubernetes launcher's watcher). Every statement is a
-- compare-and-set on the run's status, so a replayed watch event changes nothing.

-- name: lock_pod_run
-- The run a Pod belongs to, locked, while it is still in one of the statuses the caller handles and
-- the Pod is the one recorded on it (or none is recorded yet).
SELECT id, launch_attempts
  FROM runs
 WHERE id = %(run_id)s
   AND status = ANY(%(statuses)b::smallint[])
   AND (pod_name = %(pod_name)s OR pod_name = '')
   FOR UPDATE;

-- name: lock_claimed_run_of_pod
-- A running run whose runner lives in this very Pod (its name recorded on the run), locked.
SELECT id
  FROM runs
 WHERE id = %(run_id)s AND status = 3 AND pod_name = %(pod_name)s
   FOR UPDATE;

-- name: live_pods
-- A starting run may be between launches (its new Pod not recorded yet): any of its Pods is live.
-- A running run needs only the Pod its runner lives in, and so does a run that just ended (its
-- runner is still exiting). Pods of other runs, or of runs that do not exist, are orphans.
SELECT p.name
  FROM unnest(%(run_ids)b::bigint[], %(names)b::text[]) AS p (run_id, name)
  JOIN runs r ON r.id = p.run_id
 WHERE r.status = 2
    OR ((r.pod_name = p.name OR r.pod_name = '')
        AND (r.status = 3 OR r.finished_at > clock_timestamp() - make_interval(secs => %(grace)s)));

-- Warm pools: pool Pods wait on the runner API (pool_runners rows); a dispatcher gives one a run.

-- name: assign_pool_runner
-- The freshest waiting Pod of the pool that was heard from recently gets the run; a Pod another
-- dispatcher is assigning, or the pool is retiring, is skipped.
UPDATE pool_runners
   SET run_id = %(run_id)s, run_attempt = %(attempt)s, assigned_at = clock_timestamp()
 WHERE name = (SELECT name FROM pool_runners
                WHERE cluster = %(cluster)s AND pool = %(pool)s AND assigned_at IS NULL
                  AND seen_at > clock_timestamp() - make_interval(secs => %(silent)s)
                ORDER BY seen_at DESC LIMIT 1
                  FOR UPDATE SKIP LOCKED)
   AND assigned_at IS NULL
RETURNING name

-- name: pool_runner_created
INSERT INTO pool_runners (name, cluster, pool, token_hash) VALUES (%(name)s, %(cluster)s, %(pool)s, %(token_hash)s)

-- name: pool_runner_forget
DELETE FROM pool_runners WHERE name = %(name)s

-- name: pool_runners_silent
-- Waiting Pods that stopped calling (or never started calling): no run goes to them; replaced.
DELETE FROM pool_runners
 WHERE cluster = %(cluster)s AND pool = %(pool)s AND assigned_at IS NULL
   AND ((seen_at IS NULL AND created_at < clock_timestamp() - make_interval(secs => %(start)s))
        OR seen_at < clock_timestamp() - make_interval(secs => %(silent)s))
RETURNING name

-- name: pool_size
-- Pods of the pool not given a run yet (waiting or still starting), and the queue they serve: due
-- queued runs of accounts whose memory is the pool's.
SELECT (SELECT count(*) FROM pool_runners
         WHERE cluster = %(cluster)s AND pool = %(pool)s AND assigned_at IS NULL) AS idle,
       (SELECT count(*) FROM runs r JOIN accounts a ON a.id = r.account_id
         WHERE r.status = 1 AND r.scheduled_at <= now() AND (r.not_before IS NULL OR r.not_before <= now())
           AND a.memory_mb = %(memory_mb)s) AS queued

-- name: pool_runners_retire
-- Idle Pods above the pool's size, oldest first; one being assigned right now is skipped.
DELETE FROM pool_runners
 WHERE name IN (SELECT name FROM pool_runners
                 WHERE cluster = %(cluster)s AND pool = %(pool)s AND assigned_at IS NULL
                 ORDER BY created_at LIMIT %(count)s
                   FOR UPDATE SKIP LOCKED)
   AND assigned_at IS NULL
RETURNING name

-- name: pool_runners_done
-- Rows of Pods that were given a run that has ended, or that were spent long ago.
DELETE FROM pool_runners p
 WHERE p.cluster = %(cluster)s AND p.assigned_at IS NOT NULL
   AND (p.handed_at < clock_timestamp() - interval '1 hour'
        OR EXISTS (SELECT 1 FROM runs r WHERE r.id = p.run_id AND r.status >= 10))
