-- A run's job and its account are one foreign key, the job's (id, account_id): one check per
-- inserted run instead of two (the account through its job, whose own key holds it), and a run can
-- no longer name a job of another account. Deleting an account still deletes its runs, through its
-- jobs. The two checks, each locking a row per run, took 1.7 s of the 3.7 s that inserting 100,000
-- runs took; the one check takes about 0.9 s.
ALTER TABLE jobs ADD CONSTRAINT jobs_id_account_id_key UNIQUE (id, account_id);
ALTER TABLE runs
    DROP CONSTRAINT runs_account_id_fkey,
    DROP CONSTRAINT runs_job_id_fkey,
    ADD CONSTRAINT runs_job_account_fkey FOREIGN KEY (job_id, account_id)
        REFERENCES jobs (id, account_id) ON DELETE CASCADE;
