-- The forecast of demand, as its readers see it (the warm pools, `runplane status`).

-- name: forecast
-- The fresh workers' forecasts summed, per runner kind and minute, from the given minute on.
SELECT dbt_version, memory_mb, minute, sum(fires)::bigint AS fires
FROM demand_forecast
WHERE published_at > now() - make_interval(secs => %(stale_after)s) AND minute >= %(from_minute)s
GROUP BY dbt_version, memory_mb, minute
ORDER BY minute, dbt_version, memory_mb;

-- name: api_runs
-- API-triggered runs queued over the last window, per runner kind (runs_api_queued_idx).
SELECT coalesce(e.dbt_version, '') AS dbt_version, a.memory_mb, count(*)::bigint AS runs
FROM runs r
JOIN jobs j ON j.id = r.job_id
JOIN accounts a ON a.id = r.account_id
LEFT JOIN environments e ON e.id = j.environment_id
WHERE r.trigger = 'api' AND r.queued_at > now() - make_interval(secs => %(window)s)
GROUP BY 1, 2;

-- name: publish
-- One worker's forecast of the minutes to come (the caller holds a transaction, after withdraw).
INSERT INTO demand_forecast (worker_id, dbt_version, memory_mb, minute, fires)
SELECT %(worker_id)s, f.dbt_version, f.memory_mb, f.minute, f.fires
FROM unnest(%(dbt_versions)b::text[], %(memory_mbs)b::integer[], %(minutes)b::bigint[], %(fires)b::integer[])
     AS f (dbt_version, memory_mb, minute, fires);

-- name: withdraw
-- A worker's forecast of the minutes to come, about to be replaced. The rows of the current minute
-- and those before stay as forecast before the minute began (what the pools hold during it, and
-- what `runplane status` sets beside what happened); they are kept an hour.
DELETE FROM demand_forecast
WHERE (worker_id = %(worker_id)s AND minute > %(current_minute)s) OR minute < %(current_minute)s - 3600;

-- name: still_publishing
-- The worker's rows kept from before count as long as the worker publishes.
UPDATE demand_forecast SET published_at = now() WHERE worker_id = %(worker_id)s;

-- name: runner_kinds
-- The runner kind of each job: its environment's dbt version (empty: plain commands) and its
-- account's memory.
SELECT j.id AS job_id, coalesce(e.dbt_version, '') AS dbt_version, a.memory_mb
FROM unnest(%(job_ids)b::bigint[]) AS b (id)
JOIN jobs j ON j.id = b.id
JOIN accounts a ON a.id = j.account_id
LEFT JOIN environments e ON e.id = j.environment_id;
