-- dbt Cloud's job options: "generate docs" (dbt docs generate after the steps) and "run source
-- freshness" (dbt source freshness before them). Neither one's failure fails the run.
ALTER TABLE jobs ADD COLUMN generate_docs boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN run_source_freshness boolean NOT NULL DEFAULT false;
-- A step whose failure is reported on the step and in the log but does not fail the run.
ALTER TABLE run_steps ADD COLUMN optional boolean NOT NULL DEFAULT false;
