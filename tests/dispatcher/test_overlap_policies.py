"""Two cron runs of one job colliding, under each overlap policy, on the real Postgres and Redis: the
queuer's tick decides the fire (queue_runs), a real dispatcher pass decides what starts."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.service import Dispatcher
from queuer_worker.firing import TickResult, queue_runs
from queuer_worker.heap import Due
from runplane.adapters.db import Connection, open_pool
from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, RunStatus
from tests.support.launchers import HoldingLauncher
from tests.support.records import Conn, create_account

FIRE = (int(time.time()) - 3600) // 60 * 60  # a minute boundary an hour ago: its runs are due at once
EVERY_MINUTE = "* * * * *"


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(settings.database_url, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


def scheduled_job(db: Conn, account: int, policy: str) -> int:
    row = db.execute(
        "INSERT INTO jobs (account_id, name, job_type, steps, cron, overlap_policy)"
        " VALUES (%s, %s, 'deploy', ARRAY['true'], %s, %s) RETURNING id",
        (account, f"every minute, {policy}", EVERY_MINUTE, policy),
    ).fetchone()
    assert row is not None
    # Its schedule has been in force since before the fires these tests make.
    db.execute("UPDATE job_schedules SET valid_from = to_timestamp(%s) WHERE job_id = %s", (FIRE - 3600, row[0]))
    return int(row[0])


async def fire(pool: AsyncConnectionPool[Connection], job: int, n: int) -> TickResult:
    """The job's n-th fire (0: the first), as the queuer worker queues a tick."""
    return await queue_runs(pool, [Due(job, FIRE + 60 * n, EVERY_MINUTE, "UTC")])


async def dispatch(settings: Settings, locks: RedisAccountLocks, account: int) -> list[int]:
    pool = await open_pool(settings.database_url)
    try:
        dispatcher = Dispatcher(settings, pool, None, locks, HoldingLauncher())
        return [s.run_id for s in await dispatcher.dispatch([AccountId(account)])]
    finally:
        await pool.close()


def job_runs(db: Conn, job: int) -> list[tuple[int, int, str, str]]:
    """(id, status, status_message or cancel_reason, waiting_reason) of the job's runs, oldest first."""
    rows = db.execute(
        "SELECT id, status, coalesce(nullif(status_message, ''), cancel_reason), waiting_reason"
        " FROM runs WHERE job_id = %s ORDER BY id",
        (job,),
    ).fetchall()
    return [(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]


def skipped(db: Conn, job: int) -> list[tuple[str, datetime, str, int | None]]:
    rows = db.execute(
        "SELECT occurrence_key, scheduled_at, reason, blocking_run_id FROM skipped_occurrences"
        " WHERE job_id = %s ORDER BY scheduled_at",
        (job,),
    ).fetchall()
    return [(str(r[0]), r[1], str(r[2]), None if r[3] is None else int(r[3])) for r in rows]


def at(n: int) -> datetime:
    return datetime.fromtimestamp(FIRE + 60 * n, UTC)


async def first_run_in_progress(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks, policy: str
) -> tuple[int, int, int]:
    """A job of ``policy`` whose first cron run a dispatcher started (status starting): account, job, run."""
    account = create_account(db, run_slots=5)
    job = scheduled_job(db, account, policy)
    assert (await fire(pool, job, 0)).queued == 1
    (first,) = await dispatch(settings, locks, account)
    return account, job, first


async def test_serial_waits_and_a_newer_fire_supersedes_the_waiting_one(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, _first = await first_run_in_progress(db, pool, settings, locks, "serial")
    assert (await fire(pool, job, 1)).queued == 1
    assert await dispatch(settings, locks, account) == []
    second = job_runs(db, job)[1]
    assert second[1:] == (RunStatus.QUEUED, "", "job_already_running")
    result = await fire(pool, job, 2)
    assert (result.queued, result.superseded, result.skipped) == (1, 1, 0)
    statuses = [r[1] for r in job_runs(db, job)]
    assert statuses == [RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.QUEUED]
    assert skipped(db, job) == []


async def test_skip_makes_no_run_and_records_the_occurrence_with_the_run_in_the_way(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, first = await first_run_in_progress(db, pool, settings, locks, "skip")
    result = await fire(pool, job, 1)
    assert (result.queued, result.skipped) == (0, 1)
    assert [r[0] for r in job_runs(db, job)] == [first]
    assert skipped(db, job) == [(f"sched:{job}:{FIRE + 60}", at(1), "overlap", first)]
    # The same fire again (a redelivery, a second owner) stays skipped, even once the job is free.
    db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (first,))
    again = await fire(pool, job, 1)
    assert (again.queued, again.skipped) == (0, 0)
    assert len(skipped(db, job)) == 1
    # The next fire, with nothing in progress, runs.
    assert (await fire(pool, job, 2)).queued == 1
    assert await dispatch(settings, locks, account) == [job_runs(db, job)[-1][0]]


async def test_buffer_one_keeps_one_waiting_and_skips_the_fire_after(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, first = await first_run_in_progress(db, pool, settings, locks, "buffer_one")
    assert (await fire(pool, job, 1)).queued == 1
    waiting = job_runs(db, job)[1][0]
    result = await fire(pool, job, 2)
    assert (result.queued, result.superseded, result.skipped) == (0, 0, 1)
    assert [r[1] for r in job_runs(db, job)] == [RunStatus.STARTING, RunStatus.QUEUED]
    assert skipped(db, job) == [(f"sched:{job}:{FIRE + 120}", at(2), "overlap", waiting)]
    # The one that waited runs once the first ends.
    db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (first,))
    assert await dispatch(settings, locks, account) == [waiting]


async def test_buffer_all_keeps_every_fire_waiting_one_at_a_time(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, first = await first_run_in_progress(db, pool, settings, locks, "buffer_all")
    for n in (1, 2, 3):
        result = await fire(pool, job, n)
        assert (result.queued, result.superseded, result.skipped) == (1, 0, 0)
    assert await dispatch(settings, locks, account) == []
    runs = job_runs(db, job)
    assert [r[1] for r in runs] == [RunStatus.STARTING] + [RunStatus.QUEUED] * 3
    assert {r[3] for r in runs[1:]} == {"job_already_running"}
    db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (first,))
    assert await dispatch(settings, locks, account) == [runs[1][0]]  # the oldest waiting, and only it


async def test_cancel_other_cancels_the_run_in_progress_and_the_waiting_one(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, first = await first_run_in_progress(db, pool, settings, locks, "cancel_other")
    result = await fire(pool, job, 1)
    assert (result.queued, result.replaced) == (1, 1)
    first_row, second = job_runs(db, job)
    # A starting run is asked to stop (its runner sees cancel_requested_at) and says why.
    assert first_row[1] == RunStatus.STARTING
    assert f"replaced by the newer scheduled run {second[0]}" in first_row[2]
    requested = db.execute("SELECT cancel_requested_at IS NOT NULL FROM runs WHERE id = %s", (first,)).fetchone()
    assert requested == (True,)
    # A third fire cancels the second while it still waits, at once.
    assert (await fire(pool, job, 2)).replaced == 2
    runs = job_runs(db, job)
    assert runs[1][1] == RunStatus.CANCELLED
    assert f"replaced by the newer scheduled run {runs[2][0]}" in runs[1][2]
    # The newest waits for the cancelled run to end, then runs.
    assert await dispatch(settings, locks, account) == []
    db.execute("UPDATE runs SET status = 30, finished_at = now() WHERE id = %s", (first,))
    assert await dispatch(settings, locks, account) == [runs[2][0]]


async def test_allow_all_runs_beside_the_run_in_progress_within_the_slots(
    db: Conn, pool: AsyncConnectionPool[Connection], settings: Settings, locks: RedisAccountLocks
) -> None:
    account, job, _first = await first_run_in_progress(db, pool, settings, locks, "allow_all")
    assert (await fire(pool, job, 1)).queued == 1
    second = job_runs(db, job)[1][0]
    assert await dispatch(settings, locks, account) == [second]
    assert [r[1] for r in job_runs(db, job)] == [RunStatus.STARTING, RunStatus.STARTING]
    # Bounded by the account's run slots: with both taken, a third waits for a slot.
    db.execute("UPDATE accounts SET run_slots = 2 WHERE id = %s", (account,))
    assert (await fire(pool, job, 2)).queued == 1
    assert await dispatch(settings, locks, account) == []
    assert job_runs(db, job)[2][3] == "no_run_slot"
