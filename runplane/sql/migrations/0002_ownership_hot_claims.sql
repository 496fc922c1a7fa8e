-- Claims rewrite every ownership row once (pending -> claimed, with the owner). Without an index
-- on worker_id, and with room left on each page, that is a heap-only update: no index entry is
-- written per claim. Lookups by worker (a dead worker's jobs, the status counts) are rare and scan.
DROP INDEX job_ownership_worker_idx;
ALTER TABLE job_ownership SET (fillfactor = 70);
