-- The scheduler loop.

-- name: accounts_with_due_runs
SELECT DISTINCT account_id
  FROM runs
 WHERE status = 1
   AND scheduled_at <= clock_timestamp()
   AND (not_before IS NULL OR not_before <= clock_timestamp())

-- name: stuck_starting
SELECT id, launch_attempts
  FROM runs
 WHERE status = 2 AND dispatched_at < clock_timestamp() - make_interval(secs => %(start_timeout)s)
 ORDER BY id
 LIMIT %(limit)s

-- name: lost_running
SELECT id FROM runs WHERE status = 3 AND lease_expires_at < clock_timestamp() ORDER BY id LIMIT %(limit)s

-- name: forget_silent_dispatchers
DELETE FROM dispatchers WHERE last_seen_at < now() - make_interval(secs => %(silent_seconds)s)

-- name: run_gauges
SELECT count(*) FILTER (WHERE status = 1) AS queued,
       count(*) FILTER (WHERE status IN (2, 3)) AS running,
       count(*) FILTER (WHERE status IN (2, 3) AND takes_slot) AS slots_in_use,
       COALESCE(extract(epoch FROM clock_timestamp() - min(queued_at) FILTER (WHERE status = 1)), 0)::float8
           AS oldest_queued_age
  FROM runs
 WHERE status IN (1, 2, 3)
