-- Fan-in: a job with completion_mode 'all' runs once every upstream job of its completion triggers
-- has finished with a counted status since its last such run (each satisfied set once). 'any' (the
-- default) runs on each upstream run, as before.
ALTER TABLE jobs ADD COLUMN completion_mode text NOT NULL DEFAULT 'any' CHECK (completion_mode IN ('any', 'all'));

-- Per all-of job and upstream job, the newest upstream run already counted in a set (or, when the
-- trigger was saved, the upstream's newest run then: only later runs count).
CREATE TABLE completion_consumed (
    job_id           bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    upstream_job_id  bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    last_run_id      bigint NOT NULL,
    PRIMARY KEY (job_id, upstream_job_id)
);
