-- A dbt run's setup is listed as steps of their own, first, as dbt Cloud lists them ("Clone git
-- repository", "Create profile from connection …", "Invoke dbt deps"): each has its status,
-- duration and log, and the job's commands are numbered after them. Their `command` is the step's
-- name; `setup` tells them from the job's commands (a rerun from failure starts at a command).
ALTER TABLE run_steps ADD COLUMN setup boolean NOT NULL DEFAULT false;
