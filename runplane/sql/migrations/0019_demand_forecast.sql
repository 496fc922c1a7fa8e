-- The forecast of demand: how many cron fires are due per minute over the next minutes, by runner
-- kind (the environment's dbt version, the account's memory), one set of rows per queuer worker,
-- replaced whole each time the worker publishes. Readers (the warm pools, `runplane status`) sum the
-- workers whose rows are fresh. Unlogged: a forecast is rebuilt within seconds after a crash, and
-- writing it needs no WAL.
CREATE UNLOGGED TABLE demand_forecast (
    worker_id     text NOT NULL,
    dbt_version   text NOT NULL,                      -- empty: plain commands
    memory_mb     integer NOT NULL,
    minute        bigint NOT NULL,                    -- unix seconds of the minute's start
    fires         integer NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, dbt_version, memory_mb, minute)
);

-- API triggers' recent rate, added to the forecast. Only API runs enter this index: a cron run's
-- insert at the top of the hour does not pay for it.
CREATE INDEX runs_api_queued_idx ON runs (queued_at) WHERE trigger = 'api';
