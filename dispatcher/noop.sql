-- The noop launcher (benchmarks only).

-- name: claim_and_finish
-- The accounts of the runs it ended that still have queued runs: their slots are free again.
WITH finished AS (
    UPDATE runs
       SET status = 10,
           started_at = clock_timestamp(),
           finished_at = clock_timestamp(),
           status_message = 'finished by the noop launcher'
     WHERE id = ANY(%(ids)b::bigint[]) AND status = 2
    RETURNING job_id, account_id
), reset AS (
    UPDATE jobs SET consecutive_failures = 0
     WHERE id IN (SELECT job_id FROM finished) AND consecutive_failures <> 0
)
SELECT DISTINCT f.account_id
  FROM finished f
 WHERE EXISTS (SELECT 1 FROM runs r WHERE r.account_id = f.account_id AND r.status = 1)
