-- Figures for `runplane status`, all read from the system of record.

-- name: queue
SELECT
    count(*) FILTER (WHERE status = 1) AS queued,
    count(*) FILTER (WHERE status = 1 AND scheduled_at <= now()) AS queued_due,
    coalesce(extract(epoch FROM now() - min(queued_at) FILTER (WHERE status = 1)), 0)::float8 AS oldest_queued_age_seconds,
    count(*) FILTER (WHERE status = 2) AS starting,
    count(*) FILTER (WHERE status = 3) AS running,
    count(*) FILTER (WHERE status IN (2, 3) AND takes_slot) AS slots_in_use
FROM runs
WHERE status IN (1, 2, 3);

-- name: slots_total
SELECT coalesce(sum(run_slots), 0)::bigint AS slots_total FROM accounts;

-- name: delays
-- Over runs that started within the window. Run delay = started_at - scheduled_at.
WITH w AS (
    SELECT
        extract(epoch FROM queued_at - scheduled_at) AS trigger_lag,
        extract(epoch FROM dispatched_at - queued_at) AS wait_time,
        extract(epoch FROM started_at - dispatched_at) AS prep_time,
        extract(epoch FROM started_at - scheduled_at) AS run_delay
    FROM runs
    WHERE started_at >= now() - make_interval(secs => %(window_seconds)s)
)
SELECT
    count(*) AS started,
    count(*) FILTER (WHERE run_delay <= 25) AS on_time_25,
    count(*) FILTER (WHERE run_delay > 25 AND run_delay <= 60) AS on_time_60,
    count(*) FILTER (WHERE run_delay > 60) AS late,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY trigger_lag) AS trigger_lag_p50,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY trigger_lag) AS trigger_lag_p99,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_time) AS wait_time_p50,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_time) AS wait_time_p99,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY prep_time) AS prep_time_p50,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY prep_time) AS prep_time_p99,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY run_delay) AS run_delay_p50,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY run_delay) AS run_delay_p99
FROM w;

-- name: finished
SELECT status, count(*) AS runs
FROM runs
WHERE finished_at >= now() - make_interval(secs => %(window_seconds)s)
GROUP BY status ORDER BY status;

-- name: orchestrator
SELECT term, leader, elected_at FROM orchestrator_term;

-- name: workers
SELECT
    w.worker_id,
    w.state,
    extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_seconds,
    coalesce(o.jobs_owned, 0) AS jobs_owned
FROM queuer_workers w
LEFT JOIN (
    SELECT worker_id, count(*) AS jobs_owned FROM job_ownership WHERE state = 'claimed' GROUP BY worker_id
) o ON o.worker_id = w.worker_id
ORDER BY w.state, w.worker_id;

-- name: dispatchers
SELECT
    dispatcher_id, cluster, launcher, dispatched,
    extract(epoch FROM now() - last_seen_at)::float8 AS last_seen_age_seconds
FROM dispatchers
ORDER BY dispatcher_id;

-- name: waiting
SELECT r.account_id, a.name AS account_name, nullif(r.waiting_reason, '') AS waiting_reason, count(*) AS runs
FROM runs r JOIN accounts a ON a.id = r.account_id
WHERE r.status = 1
GROUP BY r.account_id, a.name, nullif(r.waiting_reason, '')
ORDER BY runs DESC, r.account_id
LIMIT 50;

-- name: accounts_on_time
-- Per account with runs queued in the window: runs that started or can no longer be on time, and
-- how many of those were on time (runplane/basics/on_time.py). One index range per account
-- (runs_account_queued_idx), so the cost follows the window, not the history.
SELECT a.id AS account_id, a.name AS account_name, w.considered, w.on_time
FROM accounts a
CROSS JOIN LATERAL (
    SELECT
        count(*) FILTER (WHERE r.started_at IS NOT NULL
                            OR (r.status IN (1, 2) AND r.scheduled_at < now() - make_interval(secs => %(on_time_seconds)s)))
            AS considered,
        count(*) FILTER (WHERE r.started_at - r.scheduled_at <= make_interval(secs => %(on_time_seconds)s)) AS on_time
    FROM runs r
    WHERE r.account_id = a.id AND r.queued_at >= now() - make_interval(secs => %(window_seconds)s)
) w
WHERE w.considered > 0;

-- name: demand
-- Per minute, from a few minutes back to the forecast's end: cron fires forecast (by the queuer
-- workers publishing now; a minute keeps what was forecast before it began), cron runs that were due
-- then, and how many of those have started.
WITH minutes AS (
    SELECT generate_series(%(from_minute)s::bigint, %(to_minute)s::bigint, 60) AS minute
), forecast AS (
    SELECT minute, sum(fires)::bigint AS fires FROM demand_forecast
    WHERE published_at > now() - make_interval(secs => %(stale_after)s)
      AND minute BETWEEN %(from_minute)s AND %(to_minute)s
    GROUP BY minute
), due AS (
    SELECT (floor(extract(epoch FROM scheduled_at) / 60) * 60)::bigint AS minute, count(*) AS runs,
           count(started_at) AS started
    FROM runs
    WHERE trigger = 'schedule' AND scheduled_at >= to_timestamp(%(from_minute)s)
      AND scheduled_at < to_timestamp(%(to_minute)s + 60)
    GROUP BY 1
)
SELECT m.minute, coalesce(f.fires, 0)::bigint AS forecast, coalesce(d.runs, 0)::bigint AS due,
       coalesce(d.started, 0)::bigint AS started
FROM minutes m LEFT JOIN forecast f USING (minute) LEFT JOIN due d USING (minute)
ORDER BY m.minute;

-- name: pools
-- Warm Pod pools now: Pods waiting or starting, and Pods given a run not yet over.
SELECT cluster, pool, count(*) FILTER (WHERE assigned_at IS NULL) AS idle,
       count(*) FILTER (WHERE assigned_at IS NOT NULL) AS given
FROM pool_runners GROUP BY cluster, pool ORDER BY cluster, pool;
