-- name: observe_runs
-- Claim what no scheduler loop has recorded yet (SKIP LOCKED: several loops never record a run
-- twice) and mark it recorded, returning the flags as they were before.
-- Bits: 1 queued, 2 started (or will never start), 4 finished.
-- A run still waiting is recorded as queued only once it has waited %(queued_after)s seconds; one
-- that starts or ends sooner has its queue event recorded then, in the same write. Each recording
-- writes the row again (and every index of runs), so at the top of the hour recording every queued
-- run at once would cost the database as much as starting it, while dispatch needs it most.
WITH picked AS (
    SELECT id, observed AS before
      FROM runs
     WHERE observed <> 7
       AND ((observed & 1 = 0
             AND (started_at IS NOT NULL OR finished_at IS NOT NULL
                  OR queued_at <= clock_timestamp() - make_interval(secs => %(queued_after)s)))
            OR (observed & 2 = 0 AND (started_at IS NOT NULL OR finished_at IS NOT NULL))
            OR (observed & 4 = 0 AND finished_at IS NOT NULL))
     ORDER BY id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE runs r
   SET observed = r.observed | 1
                | CASE WHEN r.started_at IS NOT NULL OR r.finished_at IS NOT NULL THEN 2 ELSE 0 END
                | CASE WHEN r.finished_at IS NOT NULL THEN 4 ELSE 0 END
  FROM picked p
 WHERE r.id = p.id
RETURNING p.before, r.status, r.trigger, r.job_type, r.scheduled_at, r.queued_at, r.dispatched_at,
          r.started_at, r.finished_at;
