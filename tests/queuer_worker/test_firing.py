"""Queuing a tick's runs in real Postgres: keys, over-scheduling, deactivated and deleted jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from psycopg_pool import AsyncConnectionPool

from queuer_worker.firing import prepare_chunks, queue_runs
from queuer_worker.heap import Due
from runplane.adapters.db import Connection, open_pool
from runplane.basics.settings import Settings
from tests.support.queuer import Db, insert_accounts, insert_jobs

FIRE = 1_900_000_020 // 60 * 60  # a minute boundary


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(settings.database_url, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


def due(job_id: int, fire: int) -> Due:
    """A fire of a job scheduled every minute in UTC (the jobs these tests make)."""
    return Due(job_id, fire, "* * * * *", "UTC")


def runs(db: Db, job_id: int) -> list[tuple[str, int, str, str]]:
    return [
        (str(r[0]), int(r[1]), str(r[2]), str(r[3]))
        for r in db.execute(
            "SELECT idempotency_key, status, trigger, status_message FROM runs WHERE job_id = %s ORDER BY id", (job_id,)
        )
    ]


async def test_runs_carry_the_job_and_the_fire(pool: AsyncConnectionPool[Connection], db: Db) -> None:
    account = insert_accounts(db, 1)
    deploy = insert_jobs(db, 1, cron="* * * * *", accounts=account)[0]
    ci = insert_jobs(db, 1, cron="* * * * *", accounts=account, job_type="ci")[0]
    db.execute("UPDATE jobs SET priority = 7 WHERE id = %s", (deploy,))
    result = await queue_runs(pool, [due(deploy, FIRE), due(ci, FIRE)])
    assert (result.queued, result.accounts) == (2, frozenset(account))
    rows = db.execute(
        "SELECT job_id, account_id, job_type, trigger, status, priority, takes_slot, scheduled_at, idempotency_key"
        " FROM runs ORDER BY job_id"
    ).fetchall()
    at = datetime.fromtimestamp(FIRE, UTC)
    assert rows == [
        (deploy, account[0], "deploy", "schedule", 1, 7, True, at, f"sched:{deploy}:{FIRE}"),
        (ci, account[0], "ci", "schedule", 1, 0, False, at, f"sched:{ci}:{FIRE}"),
    ]


async def test_a_fire_queued_twice_is_one_run(pool: AsyncConnectionPool[Connection], db: Db) -> None:
    job = insert_jobs(db, 1, cron="* * * * *")[0]
    first = await queue_runs(pool, [due(job, FIRE), due(job, FIRE)])
    again = await queue_runs(pool, [due(job, FIRE)])
    assert (first.queued, again.queued, again.superseded) == (1, 0, 0)
    assert [r[0] for r in runs(db, job)] == [f"sched:{job}:{FIRE}"]


async def test_over_scheduled_run_is_cancelled_but_not_other_triggers(
    pool: AsyncConnectionPool[Connection], db: Db
) -> None:
    account = insert_accounts(db, 1)
    job, other = insert_jobs(db, 2, cron="* * * * *", accounts=account)
    await queue_runs(pool, [due(job, FIRE), due(other, FIRE)])
    # Still queued at the next fire: an API run and a manual run of the same job, and a running cron run.
    for key, trigger, status in (("api-1", "api", 1), ("manual-1", "manual", 1), ("running", "schedule", 3)):
        db.execute(
            "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at,"
            " status, lease_expires_at) VALUES (%s, %s, 'deploy', %s, %s, true, to_timestamp(%s), %s,"
            " now() + interval '30 s')",
            (account[0], job, trigger, key, FIRE - 600, status),
        )
    result = await queue_runs(pool, [due(job, FIRE + 60)])
    assert result.superseded == 1
    assert result.superseded_by_reason == {"job_running": 1}
    by_key = {key: (status, trigger, message) for key, status, trigger, message in runs(db, job)}
    status, _, message = by_key[f"sched:{job}:{FIRE}"]
    assert status == 30
    assert "superseded by a newer scheduled run" in message
    assert "less frequent" in message and "faster" in message
    assert by_key[f"sched:{job}:{FIRE + 60}"][0] == 1
    assert by_key["api-1"][0] == 1 and by_key["manual-1"][0] == 1 and by_key["running"][0] == 3
    # Another job's queued run is not touched.
    assert runs(db, other)[0][1] == 1


async def test_deactivated_paused_deleted_and_unscheduled_jobs_queue_nothing(
    pool: AsyncConnectionPool[Connection], db: Db
) -> None:
    active, deactivated, paused, deleted, unscheduled = insert_jobs(db, 5, cron="* * * * *")
    db.execute("UPDATE jobs SET deactivated_at = now() WHERE id = %s", (deactivated,))
    db.execute("UPDATE jobs SET paused_at = now() WHERE id = %s", (paused,))
    db.execute("UPDATE jobs SET deleted_at = now() WHERE id = %s", (deleted,))
    db.execute("UPDATE jobs SET cron = NULL WHERE id = %s", (unscheduled,))
    result = await queue_runs(pool, [due(j, FIRE) for j in (active, deactivated, paused, deleted, unscheduled)])
    assert result.queued == 1
    assert [r[0] for r in db.execute("SELECT job_id FROM runs")] == [active]


def _running(
    db: Db, account: int, job: int, key: str, *, status: int = 3, lease: str = "30 s", age: str = "0 s"
) -> None:
    db.execute(
        "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at, status,"
        " dispatched_at, lease_expires_at) VALUES (%s, %s, 'deploy', 'api', %s, true, now(), %s,"
        " now() - %s::interval, now() + %s::interval)",
        (account, job, key, status, age, lease),
    )


async def test_a_run_superseded_while_the_slots_were_full_says_so(
    pool: AsyncConnectionPool[Connection], db: Db
) -> None:
    account = insert_accounts(db, 1, run_slots=2)
    job, busy_1, busy_2 = insert_jobs(db, 3, cron="* * * * *", accounts=account)
    await queue_runs(pool, [due(job, FIRE)])
    _running(db, account[0], busy_1, "busy-1")
    _running(db, account[0], busy_2, "busy-2", status=2)  # a fresh start holds its slot too
    result = await queue_runs(pool, [due(job, FIRE + 60)])
    assert result.superseded_by_reason == {"no_slot": 1}
    message = runs(db, job)[0][3]
    assert "free run slot" in message and "over-scheduled" not in message


async def test_a_run_superseded_because_runplane_was_behind_gives_no_advice(
    pool: AsyncConnectionPool[Connection], db: Db
) -> None:
    account = insert_accounts(db, 1, run_slots=2)
    job, stale_1, stale_2 = insert_jobs(db, 3, cron="* * * * *", accounts=account)
    await queue_runs(pool, [due(job, FIRE)])
    # What a dead dispatcher leaves behind: starts that never got a runner, and this job's runner whose
    # lease expired. Neither is the account's load nor the job's.
    _running(db, account[0], stale_1, "stale-1", status=2, age="5 min")
    _running(db, account[0], stale_2, "stale-2", status=2, age="5 min")
    _running(db, account[0], job, "lost", lease="-1 min")
    result = await queue_runs(pool, [due(job, FIRE + 60)])
    assert result.superseded_by_reason == {"behind": 1}
    message = next(m for key, _, _, m in runs(db, job) if key == f"sched:{job}:{FIRE}")
    assert "runplane was behind" in message and "Nothing needs to change" in message
    assert "over-scheduled" not in message and "slot" not in message


def test_a_tick_is_prepared_in_chunks_that_keep_every_fire_once() -> None:
    fires = [due(job_id, FIRE) for job_id in range(1, 24)]
    ticks = prepare_chunks(fires, 10)
    assert [len(t.due) for t in ticks] == [10, 10, 3]
    assert [fire for t in ticks for fire in t.due] == fires
    assert ticks[2].job_ids == "{21,22,23}" and ticks[2].keys.count("sched:") == 3
    assert prepare_chunks([], 10) == []
