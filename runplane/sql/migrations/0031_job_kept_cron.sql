-- The cron of a job whose schedule trigger is off, kept as dbt Cloud keeps it: turning the schedule
-- off and on again over REST gives back the same schedule. Nothing schedules from it: only `cron`
-- (NULL while the trigger is off) is a schedule.

ALTER TABLE jobs ADD COLUMN kept_cron text;
