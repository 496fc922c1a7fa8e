-- The runner: claim, lease, steps, logs, artifacts.

-- name: heartbeat
UPDATE runs
   SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
       heartbeat_at = clock_timestamp()
 WHERE id = %(run_id)s AND status = 3 AND lease_owner = %(owner)s
RETURNING cancel_requested_at IS NOT NULL AS cancel_requested

-- name: poll_run
SELECT cancel_requested_at IS NOT NULL AS cancel_requested, status = 3 AND lease_owner = %(owner)s AS held
  FROM runs WHERE id = %(run_id)s

-- name: create_steps
INSERT INTO run_steps (run_id, step_index, command)
SELECT %(run_id)s, i - 1, c FROM unnest(%(commands)s::text[]) WITH ORDINALITY AS s(c, i)
ON CONFLICT (run_id, step_index) DO NOTHING

-- name: step_started
UPDATE run_steps SET status = 3, started_at = clock_timestamp() WHERE run_id = %(run_id)s AND step_index = %(step_index)s

-- name: step_finished
UPDATE run_steps SET status = %(status)s, exit_code = %(exit_code)s, end_reason = %(end_reason)s,
                     finished_at = clock_timestamp()
 WHERE run_id = %(run_id)s AND step_index = %(step_index)s

-- name: steps_skipped
-- Never started: an earlier step failed, preparing the run failed, or the run was cancelled.
UPDATE run_steps SET skipped = true WHERE run_id = %(run_id)s AND step_index >= %(from_index)s AND started_at IS NULL

-- name: record_git_sha
UPDATE runs SET git_sha = %(git_sha)s WHERE id = %(run_id)s AND status = 3 AND lease_owner = %(owner)s

-- name: insert_log_chunks
INSERT INTO run_log_chunks (run_id, seq, step_index, text)
SELECT %(run_id)s, s, i, t FROM unnest(%(seqs)s::bigint[], %(step_indexes)s::int[], %(texts)s::text[]) AS v(s, i, t)

-- name: upsert_artifact
INSERT INTO artifacts (run_id, path, step_index, content)
VALUES (%(run_id)s, %(path)s, %(step_index)s, %(content)s)
ON CONFLICT (run_id, path, step_index) DO UPDATE SET content = EXCLUDED.content, created_at = now()
