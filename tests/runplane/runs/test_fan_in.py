"""Fan-in (all-of completion triggers) on the real Postgres: each satisfied set once, in either order,
and when the upstream runs end at the same moment on two connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from runplane.adapters.db import Connection, open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import FailureKind, Outcome
from runplane.runs.fan_in import fan_in_idempotency_key
from runplane.runs.finish import finish_run
from runplane.runs.retries import RetryPolicy
from tests.support.records import Conn, create_account, create_job, queue_run, rows

POLICY = RetryPolicy(backoff_base=10.0, backoff_cap=40.0)


@pytest.fixture
async def pools(settings: Settings) -> AsyncIterator[tuple[AsyncConnectionPool[Connection], ...]]:
    """Two pools: two runners (or dispatchers) ending upstream runs, each on its own connection."""
    first, second = await open_pool(settings.database_url), await open_pool(settings.database_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def fan_in_job(db: Conn, account: int, upstream: list[int], mode: str = "all") -> int:
    job = create_job(db, account, name="after all")
    db.execute("UPDATE jobs SET completion_mode = %s WHERE id = %s", (mode, job))
    for upstream_job in upstream:
        db.execute(
            "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, '{10}')",
            (job, upstream_job),
        )
    return job


def downstream_runs(db: Conn, job: int) -> list[str]:
    return [
        r["idempotency_key"] for r in rows(db, "SELECT idempotency_key FROM runs WHERE job_id = %s ORDER BY id", (job,))
    ]


async def succeed(pool: AsyncConnectionPool[Connection], db: Conn, job: int) -> int:
    run = queue_run(db, job, status=3)
    async with pool.connection() as conn:
        assert await finish_run(conn, run, Outcome.success(), policy=POLICY)
    return run


async def test_each_satisfied_set_runs_once_in_either_order(
    db: Conn, pools: tuple[AsyncConnectionPool[Connection], ...]
) -> None:
    pool = pools[0]
    account = create_account(db)
    a, b = create_job(db, account, name="a"), create_job(db, account, name="b")
    c = fan_in_job(db, account, [a, b])

    a1 = await succeed(pool, db, a)
    assert downstream_runs(db, c) == []  # b has not finished yet
    b1 = await succeed(pool, db, b)
    assert downstream_runs(db, c) == [fan_in_idempotency_key(c, (a1, b1))]

    # The other order, a failure that does not count, and a second run of b before a: the newest counts.
    b2 = await succeed(pool, db, b)
    failed = queue_run(db, a, status=3)
    async with pool.connection() as conn:
        assert await finish_run(conn, failed, Outcome.error("boom", FailureKind.STEP), policy=POLICY)
    b3 = await succeed(pool, db, b)
    assert len(downstream_runs(db, c)) == 1
    a2 = await succeed(pool, db, a)
    assert downstream_runs(db, c)[1:] == [fan_in_idempotency_key(c, (a2, b3))]
    assert b2 < b3
    [queued] = rows(
        db, "SELECT trigger, upstream_run_id, cause FROM runs WHERE job_id = %s ORDER BY id DESC LIMIT 1", (c,)
    )
    assert queued["trigger"] == "completion" and queued["upstream_run_id"] == a2
    assert queued["cause"] == f"all upstream jobs finished: runs {a2}, {b3}"

    # any-of, for comparison: a run per upstream run.
    d = fan_in_job(db, account, [a, b], mode="any")
    await succeed(pool, db, a)
    await succeed(pool, db, b)
    assert len(downstream_runs(db, d)) == 2


async def test_upstream_runs_ending_together_on_two_connections_queue_one_run_per_set(
    db: Conn, pools: tuple[AsyncConnectionPool[Connection], ...]
) -> None:
    account = create_account(db)
    a, b = create_job(db, account, name="a"), create_job(db, account, name="b")
    c = fan_in_job(db, account, [a, b])
    rounds = 12
    for n in range(1, rounds + 1):
        run_a, run_b = queue_run(db, a, status=3), queue_run(db, b, status=3)

        async def end(pool: AsyncConnectionPool[Connection], run: int) -> None:
            async with pool.connection() as conn:
                assert await finish_run(conn, run, Outcome.success(), policy=POLICY)

        # Alternate which one starts first; both commit within the same moment.
        first, second = (run_a, run_b) if n % 2 else (run_b, run_a)
        await asyncio.gather(end(pools[0], first), end(pools[1], second))
        assert downstream_runs(db, c)[n - 1 :] == [fan_in_idempotency_key(c, (run_a, run_b))], f"round {n}"
    assert len(downstream_runs(db, c)) == rounds
