-- Dispatchers.

-- name: pass_timeouts
-- For this transaction only: how long the pass may wait for the account row, and sit idle in it.
SELECT set_config('lock_timeout', %(ms)s, true), set_config('idle_in_transaction_session_timeout', %(ms)s, true)

-- name: lock_account
SELECT id, run_slots, memory_mb FROM accounts WHERE id = %(account_id)s FOR UPDATE

-- name: account_runs
-- Everything one pass decides on, in one round trip: the account's starting/running runs (active)
-- and its first due queued runs in dispatch order (queued).
SELECT true AS active, id, job_id, job_type, takes_slot, priority, queued_at, pull_request_number, schema_name
  FROM runs
 WHERE account_id = %(account_id)s AND status IN (2, 3)
UNION ALL
(SELECT false, id, job_id, job_type, takes_slot, priority, queued_at, pull_request_number, schema_name
   FROM runs
  WHERE account_id = %(account_id)s
    AND status = 1
    AND scheduled_at <= clock_timestamp()
    AND (not_before IS NULL OR not_before <= clock_timestamp())
  ORDER BY priority DESC, queued_at, id
  LIMIT %(limit)s)

-- name: set_waiting_reasons
UPDATE runs r
   SET waiting_reason = v.reason
  FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS v(id, reason)
 WHERE r.id = v.id AND r.status = 1 AND r.waiting_reason <> v.reason

-- name: record_launches
UPDATE runs r
   SET pod_name = v.pod_name, cluster = v.cluster
  FROM unnest(%(ids)s::bigint[], %(pod_names)s::text[], %(clusters)s::text[]) AS v(id, pod_name, cluster)
 WHERE r.id = v.id AND r.status IN (2, 3)

-- name: dispatcher_seen
INSERT INTO dispatchers (dispatcher_id, cluster, launcher, dispatched)
VALUES (%(dispatcher_id)s, %(cluster)s, %(launcher)s, %(dispatched)s)
ON CONFLICT (dispatcher_id) DO UPDATE SET last_seen_at = now(), dispatched = EXCLUDED.dispatched

-- name: dispatcher_gone
DELETE FROM dispatchers WHERE dispatcher_id = %(dispatcher_id)s
