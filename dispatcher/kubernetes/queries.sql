-- Reconciling run Pods with their runs (the kubernetes launcher's watcher). Every statement is a
-- compare-and-set on the run's status, so a replayed watch event changes nothing.

-- name: lock_pod_run
-- The run a Pod belongs to, locked, while it is still in one of the statuses the caller handles and
-- the Pod is the one recorded on it (or none is recorded yet).
SELECT id, launch_attempts
  FROM runs
 WHERE id = %(run_id)s
   AND status = ANY(%(statuses)s::smallint[])
   AND (pod_name = %(pod_name)s OR pod_name = '')
   FOR UPDATE;

-- name: live_pods
-- A starting run may be between launches (its new Pod not recorded yet): any of its Pods is live.
-- A running run needs only the Pod its runner lives in, and so does a run that just ended (its
-- runner is still exiting). Pods of other runs, or of runs that do not exist, are orphans.
SELECT p.name
  FROM unnest(%(run_ids)s::bigint[], %(names)s::text[]) AS p (run_id, name)
  JOIN runs r ON r.id = p.run_id
 WHERE r.status = 2
    OR ((r.pod_name = p.name OR r.pod_name = '')
        AND (r.status = 3 OR r.finished_at > clock_timestamp() - make_interval(secs => %(grace)s)));
