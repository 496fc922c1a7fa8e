-- Retention of finished runs (scheduler/retention.py).

-- name: accounts_keeping_runs_for_a_while
SELECT id, run_retention_days FROM accounts WHERE run_retention_days > 0 ORDER BY id

-- name: delete_expired_runs
-- One bounded batch of one account: its oldest finished runs past the retention, through
-- runs_retention_idx. Steps, logs and artifacts go with them (ON DELETE CASCADE); later runs that
-- named one as parent or upstream keep a NULL. SKIP LOCKED: a run some transaction holds waits for
-- the next pass.
WITH doomed AS (
    SELECT id FROM runs
     WHERE account_id = %(account_id)s AND status IN (10, 20, 30)
       AND finished_at < now() - make_interval(days => %(days)s)
     ORDER BY finished_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM runs WHERE id IN (SELECT id FROM doomed)

-- name: delete_expired_skipped_occurrences
-- The account's skipped occurrences past the same retention as its runs, one bounded batch.
DELETE FROM skipped_occurrences
 WHERE id IN (SELECT id FROM skipped_occurrences
               WHERE account_id = %(account_id)s AND recorded_at < now() - make_interval(days => %(days)s)
               ORDER BY recorded_at
               LIMIT %(batch)s)
