-- The scheduler loop.

-- name: accounts_with_due_runs
-- A cron run a queuer queued less than the grace ago is left to the Pickups of that queuer's tick
-- (at the top of the hour the sweep would otherwise double every one of them, and mark every
-- account in Redis each pass); the sweep finds it once the grace has passed. Every other run
-- counts at once: a run that became due by the clock (a backoff) has no other sender.
SELECT DISTINCT account_id
  FROM runs
 WHERE status = 1
   AND scheduled_at <= clock_timestamp()
   AND (not_before IS NULL OR not_before <= clock_timestamp())
   AND NOT (trigger = 'schedule'
            AND not_before IS NULL
            AND queued_at > clock_timestamp() - make_interval(secs => %(grace)s))

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
-- undecided: due queued runs no dispatch pass has decided on yet (one that could not start them
-- records why they wait): how far dispatch is behind.
SELECT count(*) FILTER (WHERE status = 1) AS queued,
       count(*) FILTER (WHERE status = 1 AND waiting_reason = '' AND scheduled_at <= clock_timestamp()
                          AND (not_before IS NULL OR not_before <= clock_timestamp())) AS undecided,
       count(*) FILTER (WHERE status IN (2, 3)) AS running,
       count(*) FILTER (WHERE status IN (2, 3) AND takes_slot) AS slots_in_use,
       COALESCE(extract(epoch FROM clock_timestamp() - min(queued_at)
                 FILTER (WHERE status = 1 AND queued_at <= clock_timestamp())), 0)::float8
           AS oldest_queued_age,
       count(*) FILTER (WHERE (status = 2 AND dispatched_at < clock_timestamp() - make_interval(secs => %(start_timeout)s))
                           OR (status = 3 AND lease_expires_at < clock_timestamp())) AS stuck
  FROM runs
 WHERE status IN (1, 2, 3)
