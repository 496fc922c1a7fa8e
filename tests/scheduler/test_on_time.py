"""Per-account on time: the scheduler's gauge counts accounts at or below each ratio bound, and
`runplane status` names the accounts least on time, from the same rows."""

from __future__ import annotations

import psycopg
import pytest

from runplane.adapters import instruments
from runplane.adapters.db import open_pool
from runplane.basics.settings import SchedulerSettings
from runplane.commands.status import snapshot
from scheduler.on_time import OnTimeGauge

Db = psycopg.Connection[tuple[object, ...]]


def _arrange(db: Db) -> None:
    """Account 1: 10 runs on time. Account 2: 9 of 10. Account 3: 2 on time, 2 late, 1 queued 5 min past
    its schedule (it can no longer be on time) and 1 cancelled before it started (not counted).
    Account 4: one run queued two hours ago, outside the window."""
    for account in (1, 2, 3, 4):
        db.execute("INSERT INTO accounts (id, name, run_slots) VALUES (%s, %s, 5)", (account, f"acct{account}"))
        db.execute(
            "INSERT INTO jobs (id, account_id, name, job_type, steps) VALUES (%s, %s, 'j', 'deploy', ARRAY['true'])",
            (account, account),
        )
    runs = [(1, 10, 5)] * 10 + [(2, 10, 5)] * 9 + [(2, 10, 120)] + [(3, 10, 5)] * 2 + [(3, 20, 600)] * 2
    for i, (account, status, delay) in enumerate(runs):
        db.execute(
            """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                   scheduled_at, queued_at, dispatched_at, started_at, finished_at)
               VALUES (%s, %s, 'deploy', %s, 'schedule', %s, true, now() - interval '20 minutes',
                   now() - interval '20 minutes', now() - interval '20 minutes',
                   now() - interval '20 minutes' + make_interval(secs => %s), now())""",
            (account, account, status, f"k{i}", delay),
        )
    db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
               scheduled_at, queued_at, finished_at)
           VALUES (3, 3, 'deploy', 1, 'schedule', 'waiting', true, now() - interval '5 minutes',
                   now() - interval '5 minutes', NULL),
                  (3, 3, 'deploy', 30, 'api', 'cancelled', true, now() - interval '5 minutes',
                   now() - interval '5 minutes', now()),
                  (4, 4, 'deploy', 1, 'schedule', 'old', true, now() - interval '2 hours',
                   now() - interval '2 hours', NULL)"""
    )


async def test_the_gauge_counts_accounts_at_or_below_each_bound(
    db: Db, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _arrange(db)
    seen: dict[str, int] = {}
    monkeypatch.setattr(
        instruments.accounts_by_on_time_ratio, "set", lambda value, labels: seen.__setitem__(labels["at_most"], value)
    )
    pool = await open_pool(database_url, max_size=1, name="test")
    try:
        gauge = OnTimeGauge(pool, SchedulerSettings(on_time_window=3600, on_time_interval=60))
        counts = await gauge.observe_when_due()
        assert await gauge.observe_when_due() is None  # not again before the interval
    finally:
        await pool.close()
    # Ratios: account 1 -> 1.0, account 2 -> 0.9, account 3 -> 2/5 = 0.4; account 4 has nothing in the window.
    assert counts == {"0.5": 1, "0.8": 1, "0.9": 2, "0.95": 2, "0.99": 2, "1": 3}
    assert seen == counts


def test_status_names_the_accounts_least_on_time(db: Db, database_url: str) -> None:
    _arrange(db)
    worst = snapshot(database_url, window_seconds=3600)["worst_on_time"]
    assert [(a["account_name"], a["considered"], a["on_time_ratio"]) for a in worst] == [
        ("acct3", 5, 0.4),
        ("acct2", 10, 0.9),
        ("acct1", 10, 1.0),
    ]
