-- The scheduler loop.

-- name: accounts_with_due_runs
SELECT DISTINCT account_id
  FROM runs
 WHERE status = 1
   AND scheduled_at <= clock_timestamp()
   AND (not_before IS NULL OR not_before <= clock_timestamp())

-- name: stuck_starting
-- Starting runs no runner claimed within the start timeout, and sooner, those whose dispatcher
-- stopped heartbeating before it launched them (orphaned: nobody will launch them).
SELECT r.id, r.launch_attempts, r.dispatched_at >= clock_timestamp() - make_interval(secs => %(start_timeout)s)
           AS orphaned
  FROM runs r
 WHERE r.status = 2
   AND (r.dispatched_at < clock_timestamp() - make_interval(secs => %(start_timeout)s)
        OR (r.dispatcher_id IS NOT NULL
            AND r.dispatched_at < clock_timestamp() - make_interval(secs => %(dead_after)s)
            AND NOT EXISTS (SELECT 1 FROM dispatchers d
                             WHERE d.dispatcher_id = r.dispatcher_id
                               AND d.last_seen_at > clock_timestamp() - make_interval(secs => %(dead_after)s))))
 ORDER BY r.id
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
