-- The noop launcher (benchmarks only).

-- name: claim_and_finish
WITH finished AS (
    UPDATE runs
       SET status = 10,
           started_at = clock_timestamp(),
           finished_at = clock_timestamp(),
           status_message = 'finished by the noop launcher'
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 2
    RETURNING job_id
)
UPDATE jobs SET consecutive_failures = 0
 WHERE id IN (SELECT job_id FROM finished) AND consecutive_failures <> 0
