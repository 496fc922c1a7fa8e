-- Reconciling run Pods with their runs (the kubernetes launcher's watcher). Every statement is a
-- compare-and-set on the run's status, so a replayed watch event changes nothing.

-- name: memory_limit_exceeded
UPDATE runs
   SET status = 20,
       status_message = 'memory limit error',
       finished_at = clock_timestamp(),
       lease_owner = NULL,
       lease_expires_at = NULL
 WHERE id = %(run_id)s
   AND status IN (2, 3)
   AND (pod_name = %(pod_name)s OR pod_name = '')
RETURNING id;

-- name: failed_before_claim
-- The runner never claimed the run (still starting): relaunch after a backoff while the launch
-- budget lasts, else end the run. In SET, every column reads the row as it was before the update.
UPDATE runs
   SET launch_attempts = launch_attempts + 1,
       status = CASE WHEN launch_attempts + 1 < %(launch_budget)s THEN 1 ELSE 20 END,
       not_before = CASE WHEN launch_attempts + 1 < %(launch_budget)s
                         THEN clock_timestamp() + make_interval(secs => %(backoff)s * power(2, launch_attempts))
                    END,
       waiting_reason = CASE WHEN launch_attempts + 1 < %(launch_budget)s THEN 'launch_backoff' ELSE '' END,
       status_message = CASE WHEN launch_attempts + 1 < %(launch_budget)s
                             THEN 'pod failed before the runner started, relaunching: ' || %(reason)s
                             ELSE 'pod failed before the runner started (' || (launch_attempts + 1)
                                  || ' launch attempts): ' || %(reason)s
                        END,
       pod_name = CASE WHEN launch_attempts + 1 < %(launch_budget)s THEN '' ELSE pod_name END,
       finished_at = CASE WHEN launch_attempts + 1 < %(launch_budget)s THEN NULL ELSE clock_timestamp() END
 WHERE id = %(run_id)s
   AND status = 2
   AND (pod_name = %(pod_name)s OR pod_name = '')
RETURNING status, launch_attempts;

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
