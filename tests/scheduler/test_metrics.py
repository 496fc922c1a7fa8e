"""Run-lifecycle metrics are made from the rows once per event, even with several scheduler loops."""

from __future__ import annotations

import asyncio
from collections import Counter

import psycopg
import pytest

from runplane.adapters.db import open_pool
from scheduler import metrics

Db = psycopg.Connection[tuple[object, ...]]


def _arrange(db: Db) -> None:
    db.execute("INSERT INTO accounts (id, name, run_slots) VALUES (1, 'a', 5)")
    db.execute("INSERT INTO jobs (id, account_id, name, job_type, steps) VALUES (1, 1, 'j', 'deploy', ARRAY['true'])")
    rows = [
        ("q", 1, "NULL", "NULL", "NULL"),  # queued
        ("r", 3, "now()", "now()", "NULL"),  # running
        ("s", 10, "now()", "now()", "now()"),  # success
        ("c", 30, "NULL", "NULL", "now()"),  # cancelled before it started
    ]
    for key, status, dispatched, started, finished in rows:
        db.execute(
            f"""INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                    scheduled_at, queued_at, dispatched_at, started_at, finished_at)
                VALUES (1, 1, 'deploy', {status}, 'api', '{key}', true, now(), now(),
                        {dispatched}, {started}, {finished})"""
        )


async def test_each_event_is_recorded_once_across_racing_loops(
    db: Db, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _arrange(db)
    events: Counter[tuple[str, str]] = Counter()

    def record(row: metrics.ObservedRun) -> None:
        before = row.before
        key = str(row.status)
        if not before & metrics.QUEUED:
            events[("queued", key)] += 1
        if not before & metrics.STARTED and row.started_at is not None:
            events[("started", key)] += 1
        if not before & metrics.FINISHED and row.finished_at is not None:
            events[("finished", key)] += 1

    monkeypatch.setattr(metrics, "record", record)
    pools = [await open_pool(database_url, max_size=2) for _ in range(2)]
    try:
        await asyncio.gather(*(metrics.observe_runs(pool, batch=1) for pool in pools))
        assert events == {
            ("queued", "1"): 1, ("queued", "3"): 1, ("queued", "10"): 1, ("queued", "30"): 1,
            ("started", "3"): 1, ("started", "10"): 1,
            ("finished", "10"): 1, ("finished", "30"): 1,
        }  # fmt: skip
        # The running run finishes later: only its finish is new.
        db.execute("UPDATE runs SET status = 20, finished_at = now() WHERE idempotency_key = 'r'")
        events.clear()
        assert await metrics.observe_runs(pools[0]) == 1
        assert events == {("finished", "20"): 1}
        assert await metrics.observe_runs(pools[1]) == 0
        unfinished = db.execute("SELECT idempotency_key, observed FROM runs WHERE observed <> 7").fetchall()
        assert unfinished == [("q", 1)]
    finally:
        for pool in pools:
            await pool.close()
