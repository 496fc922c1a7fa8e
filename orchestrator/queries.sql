-- name: take_lease
-- A standby's election: the lease is taken with the next term only when it has expired (or was
-- never held, or is this very process's own from before it stepped down).
UPDATE orchestrator_term
   SET term = term + 1, leader = %(leader)s, elected_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE lease_expires_at IS NULL OR lease_expires_at < now() OR leader = %(leader)s
RETURNING term;

-- name: renew_lease
UPDATE orchestrator_term SET lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE term = %(term)s
RETURNING term;

-- name: release_lease
-- A leader that stops lets a standby take over at once.
UPDATE orchestrator_term SET lease_expires_at = now() WHERE term = %(term)s;

-- name: fence
-- In each write of a leader: its term is still the newest (FOR SHARE: an election waits for it).
SELECT term FROM orchestrator_term WHERE term = %(term)s FOR SHARE;

-- name: workers
SELECT worker_id, state FROM queuer_workers;

-- name: heartbeat
INSERT INTO queuer_workers (worker_id, state, last_heartbeat_at, jobs_owned, owned_digest)
VALUES (%(worker_id)s, 'alive', now(), %(jobs_owned)s, %(owned_digest)s)
ON CONFLICT (worker_id) DO UPDATE
SET state = 'alive', last_heartbeat_at = now(), jobs_owned = EXCLUDED.jobs_owned, owned_digest = EXCLUDED.owned_digest;

-- name: beat
UPDATE queuer_workers SET last_heartbeat_at = now(), jobs_owned = %(jobs_owned)s, owned_digest = %(owned_digest)s
WHERE worker_id = %(worker_id)s AND state = 'alive';

-- name: mark_dead
UPDATE queuer_workers SET state = 'dead' WHERE worker_id = %(worker_id)s;

-- name: job_states
-- What the leader needs to decide about some jobs: whether they should be scheduled and who has them.
SELECT j.id AS job_id, j.account_id, j.version, j.cron, j.timezone, j.missed_run_grace_seconds, j.job_type,
       j.priority, j.jitter_seconds, j.catchup_window_seconds, j.catchup_all, (j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.cron IS NOT NULL) AS schedulable,
       o.job_id IS NOT NULL AS owned, o.worker_id, o.state, o.version AS sent_version
FROM jobs j LEFT JOIN job_ownership o ON o.job_id = j.id
WHERE j.id = ANY(%(job_ids)s)
UNION ALL
SELECT o.job_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, true, o.worker_id, o.state, o.version
FROM job_ownership o
WHERE o.job_id = ANY(%(job_ids)s) AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = o.job_id);

-- name: assign_new
-- Among some jobs, the schedulable ones nobody owns: recorded as pending under one Assign's stamp,
-- and returned with what the Assign says of them. One statement for the common case of a sweep.
-- Each job is looked up by its primary key (LATERAL ... LIMIT 1 keeps it a lookup), so the plan
-- stays right before a freshly loaded table has statistics.
WITH new AS (
    SELECT j.id AS job_id, j.account_id, j.version, j.cron, j.timezone, j.missed_run_grace_seconds, j.job_type,
           j.priority, j.jitter_seconds, j.catchup_window_seconds, j.catchup_all
    FROM unnest(%(job_ids)b::bigint[]) AS b (id)
    CROSS JOIN LATERAL (SELECT * FROM jobs WHERE jobs.id = b.id LIMIT 1) AS j
    WHERE j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL AND j.cron IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_ownership o WHERE o.job_id = j.id)
), recorded AS (
    INSERT INTO job_ownership (job_id, worker_id, state, term, clock, version, fires_after)
    SELECT job_id, NULL, 'pending', %(term)s, %(clock)s, version, %(now)s FROM new
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id
)
-- (Not a join with "recorded": estimated at one row each, that becomes a nested loop.)
SELECT new.* FROM new WHERE new.job_id = ANY (ARRAY(SELECT job_id FROM recorded));

-- name: drift
-- The full reconcile: every job whose ownership does not match what it should be.
SELECT coalesce(j.id, o.job_id) AS job_id
FROM jobs j FULL JOIN job_ownership o ON o.job_id = j.id
WHERE (o.job_id IS NULL AND j.deleted_at IS NULL AND j.deactivated_at IS NULL AND j.paused_at IS NULL
        AND j.cron IS NOT NULL)
   OR (o.job_id IS NOT NULL AND (j.id IS NULL OR j.deleted_at IS NOT NULL OR j.deactivated_at IS NOT NULL
                                 OR j.paused_at IS NOT NULL OR j.cron IS NULL))
   OR (o.state = 'claimed' AND o.version <> j.version)
ORDER BY 1;

-- name: account_jobs
SELECT id FROM jobs WHERE account_id = %(account_id)s;

-- name: definitions
-- Jobs of some ownership rows, optionally only those of one worker (NULL worker: pending on the
-- shared queue) and only claimed ones.
SELECT o.job_id, j.account_id, j.version, j.cron, j.timezone, j.missed_run_grace_seconds, j.job_type, j.priority,
       j.jitter_seconds, j.catchup_window_seconds, j.catchup_all, o.fires_after, o.term, o.clock, o.state
FROM job_ownership o JOIN jobs j ON j.id = o.job_id
WHERE o.job_id = ANY(%(job_ids)s) AND o.worker_id IS NOT DISTINCT FROM %(worker_id)s
  AND (NOT %(claimed)s OR o.state = 'claimed');

-- name: pending_definitions
-- Jobs whose Assign is still pending for one worker (NULL: on the shared queue), to assign again.
SELECT o.job_id, j.account_id, j.version, j.cron, j.timezone, j.missed_run_grace_seconds, j.job_type, j.priority,
       j.jitter_seconds, j.catchup_window_seconds, j.catchup_all, o.fires_after
FROM job_ownership o JOIN jobs j ON j.id = o.job_id
WHERE o.job_id = ANY(%(job_ids)s) AND o.worker_id IS NOT DISTINCT FROM %(worker_id)s AND o.state = 'pending';

-- name: upsert_pending
-- Record an Assign: pending until the worker answers Claimed. A job that had an owner keeps its
-- fires_after (its new owner may queue a fire missed in between); a new one starts now.
INSERT INTO job_ownership (job_id, worker_id, state, term, clock, version, fires_after)
SELECT d.job_id, %(worker_id)s, 'pending', %(term)s, %(clock)s, d.version, %(now)s
FROM unnest(%(job_ids)b::bigint[], %(versions)b::bigint[]) AS d (job_id, version)
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, state = 'pending', term = EXCLUDED.term, clock = EXCLUDED.clock,
    version = EXCLUDED.version, assigned_at = now();

-- name: ownership
SELECT o.job_id, o.worker_id, o.state, o.term, o.clock, o.version, j.version AS job_version
FROM job_ownership o LEFT JOIN jobs j ON j.id = o.job_id
WHERE o.job_id = ANY(%(job_ids)s);

-- name: claim
-- A claim of the Assign stamped (term, clock) takes what is still pending under that stamp,
-- unowned (the shared queue) or aimed at the claimer; the rest is answered by the caller.
UPDATE job_ownership o SET state = 'claimed', worker_id = %(worker_id)s
WHERE o.job_id = ANY(%(job_ids)s) AND o.state = 'pending' AND o.term = %(term)s AND o.clock = %(clock)s
  AND (o.worker_id IS NULL OR o.worker_id = %(worker_id)s)
RETURNING o.job_id, o.version, (SELECT j.version FROM jobs j WHERE j.id = o.job_id) AS job_version;

-- name: sent_versions
-- An Update went out: the owner now has these versions, and a later owner must not queue a fire
-- of the old schedule.
UPDATE job_ownership o SET version = d.version, fires_after = greatest(o.fires_after, %(now)s)
FROM unnest(%(job_ids)b::bigint[], %(versions)b::bigint[]) AS d (job_id, version)
WHERE o.job_id = d.job_id;

-- name: delete_ownership
DELETE FROM job_ownership WHERE job_id = ANY(%(job_ids)s);

-- name: owned_by
SELECT job_id FROM job_ownership WHERE worker_id = %(worker_id)s;

-- name: owners
SELECT DISTINCT worker_id FROM job_ownership WHERE worker_id IS NOT NULL;

-- name: stale_pending
SELECT job_id, worker_id, term, clock FROM job_ownership
WHERE state = 'pending' AND assigned_at < now() - make_interval(secs => %(timeout)s);

-- name: pending_count
SELECT count(*) AS n FROM job_ownership WHERE state = 'pending';

-- name: claimed_by_worker
SELECT worker_id, array_agg(job_id ORDER BY job_id) AS job_ids
FROM job_ownership WHERE state = 'claimed' GROUP BY worker_id;

-- name: claimed_versions
-- What each worker owns, as the versions it was sent; which workers have an Assign pending; and the
-- stamps of Assigns pending on the shared queue (worker_id NULL), which any worker may hold unclaimed.
SELECT worker_id, job_id, version, state, term, clock FROM job_ownership
WHERE worker_id IS NOT NULL OR state = 'pending';

-- name: claimed_counts
SELECT worker_id, count(*) AS n FROM job_ownership WHERE state = 'claimed' GROUP BY worker_id;
