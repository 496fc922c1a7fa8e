"""The basics every part shares, with no outside system behind them.

- ``types``: the design's words as types (ids, statuses, job types, triggers); ``errors``: the root exception.
- ``settings``: typed ``RUNPLANE_*`` settings; ``logs``: logging set-up; ``supervise``: supervised tasks
  and a bounded drain; ``wall_clock``: the current time and sleeping on it; ``process_privacy``.
- ``cron``: cron maths; ``stamps``: term and logical clock; ``ownership``: a queuer worker's digest;
  ``backoff``: the one backoff formula, for everything that tries again.
- ``secrets``: encryption at rest and masking; ``tokens``: every token runplane issues, and its hash.
- ``redis_keys``: every Redis key; ``on_time``: on time per account.
"""
