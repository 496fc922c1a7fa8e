-- Dispatchers.

-- name: pass_timeouts
-- For this transaction only: how long the pass may wait for the account rows, and sit idle in it.
SELECT set_config('lock_timeout', %(ms)s, true), set_config('idle_in_transaction_session_timeout', %(ms)s, true)

-- name: lock_accounts
-- In id order, so two passes over overlapping accounts wait for each other instead of deadlocking.
-- NO KEY UPDATE: jobs may still be created for these accounts meanwhile (their foreign key takes
-- KEY SHARE), and runs inserted (theirs locks the job's row); a later pass sees those runs.
SELECT id, run_slots, memory_mb FROM accounts WHERE id = ANY(%(account_ids)b::bigint[]) ORDER BY id FOR NO KEY UPDATE

-- name: account_runs
-- Everything one pass decides on, in one round trip: the accounts' starting/running runs (active)
-- and each account's first due queued runs in dispatch order (queued), each with whether its job's
-- overlap policy lets it run beside another run of the job (allow_all).
SELECT true AS active, account_id, id, job_id, job_type, takes_slot, priority, queued_at, pull_request_number,
       schema_name, false AS concurrent
  FROM runs
 WHERE account_id = ANY(%(account_ids)b::bigint[]) AND status IN (2, 3)
UNION ALL
SELECT false, q.*
  FROM unnest(%(account_ids)b::bigint[]) AS a(id)
 CROSS JOIN LATERAL (
       SELECT account_id, id, job_id, job_type, takes_slot, priority, queued_at, pull_request_number, schema_name,
              (SELECT j.overlap_policy = 'allow_all' FROM jobs j WHERE j.id = runs.job_id) AS concurrent
         FROM runs
        WHERE account_id = a.id
          AND status = 1
          AND scheduled_at <= clock_timestamp()
          AND (not_before IS NULL OR not_before <= clock_timestamp())
        ORDER BY priority DESC, queued_at, id
        LIMIT %(limit)s) AS q

-- name: set_waiting_reasons
UPDATE runs r
   SET waiting_reason = v.reason
  FROM unnest(%(ids)b::bigint[], %(reasons)b::text[]) AS v(id, reason)
 WHERE r.id = v.id AND r.status = 1 AND r.waiting_reason <> v.reason

-- name: record_launches
-- Where each launch put its run's runner, whatever the run's status by now (a quick run may have ended
-- before its dispatcher's batch was launched), but only for the launch it was: a run sent back to the
-- queue since (status 1, its launch forgotten) counts its next launch on.
UPDATE runs r
   SET pod_name = v.pod_name, cluster = v.cluster
  FROM unnest(%(ids)b::bigint[], %(pod_names)b::text[], %(clusters)b::text[], %(attempts)b::int[])
       AS v(id, pod_name, cluster, attempt)
 WHERE r.id = v.id AND r.launch_attempts = v.attempt AND r.status <> 1

-- name: dispatcher_seen
INSERT INTO dispatchers (dispatcher_id, cluster, launcher, dispatched)
VALUES (%(dispatcher_id)s, %(cluster)s, %(launcher)s, %(dispatched)s)
ON CONFLICT (dispatcher_id) DO UPDATE SET last_seen_at = now(), dispatched = EXCLUDED.dispatched

-- name: dispatcher_gone
DELETE FROM dispatchers WHERE dispatcher_id = %(dispatcher_id)s

-- name: local_demand
-- What the local launcher's spares serve: due queued runs, any kind (runs_queued_idx), and the other
-- live dispatchers with the local launcher on this machine's cluster, which serve them too.
SELECT (SELECT count(*) FROM runs
         WHERE status = 1 AND scheduled_at <= now() AND (not_before IS NULL OR not_before <= now()))::bigint AS queued,
       (SELECT count(*) FROM dispatchers
         WHERE launcher = 'local' AND cluster = %(cluster)s AND dispatcher_id <> %(dispatcher_id)s
           AND last_seen_at > now() - make_interval(secs => %(dead_after)s))::bigint AS others

-- name: ended_runs
-- Of the runs this dispatcher's runners were given, those that ended a while ago (by their runner,
-- the reaper or a cancel): a runner still alive then is killed with everything its run started.
SELECT id FROM runs
 WHERE id = ANY(%(run_ids)s) AND status IN (10, 20, 30)
   AND finished_at < clock_timestamp() - make_interval(secs => %(grace)s)
