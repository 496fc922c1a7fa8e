"""Fires missed while no worker held their jobs, for longer than the jobs' missed-run grace: a leader
and queuer workers in this process, on the real Postgres and RabbitMQ, on one wall clock the test
moves. The only worker stops dead after a fire; five and a half minutes later (of the test's clock) a
new worker takes its jobs over. Without a catch-up window every fire in between is a skipped
occurrence, reason ``missed``; with one, the newest fire within it gets one catch-up run (every fire
within it with ``catchup_all``), and the older ones are recorded as skipped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from runplane.basics.settings import Settings
from tests.queuer_worker.test_fires import HEARTBEAT, Services
from tests.support.polling import eventually
from tests.support.queuer import Db, all_claimed, duplicate_keys, fire_minute, insert_accounts, insert_jobs, ownership
from tests.support.wall_clock import FakeClock

pytestmark = pytest.mark.slow  # a leader and two workers

GRACE = 10


@pytest.fixture
def clock() -> FakeClock:
    """Ninety seconds before a minute to come: the jobs exist before every fire of the test."""
    return FakeClock(time.time() // 60 * 60 + 90)


@pytest.fixture
async def services(settings: Settings, clock: FakeClock) -> AsyncIterator[Services]:
    fast = settings.orchestrator.model_copy(
        update={"heartbeat_interval": HEARTBEAT, "reconcile_interval": 2.0, "claim_timeout": 5.0}
    )
    s = Services(settings.model_copy(update={"orchestrator": fast}), clock)
    try:
        yield s
    finally:
        await s.close()


def _runs(db: Db, job_id: int) -> list[int]:
    rows = db.execute(
        "SELECT extract(epoch FROM scheduled_at)::bigint FROM runs WHERE job_id = %s AND trigger = 'schedule'"
        " ORDER BY scheduled_at",
        (job_id,),
    )
    return [int(r[0]) for r in rows]


def _skipped(db: Db, job_id: int) -> dict[int, tuple[str, str]]:
    rows = db.execute(
        "SELECT extract(epoch FROM scheduled_at)::bigint, reason, detail FROM skipped_occurrences WHERE job_id = %s",
        (job_id,),
    )
    return {int(ts): (str(reason), str(detail)) for ts, reason, detail in rows}


async def test_fires_missed_beyond_the_grace_are_caught_up_within_the_window_and_skipped_beyond(
    services: Services, clock: FakeClock, db: Db
) -> None:
    accounts = insert_accounts(db, 1)
    no_window, newest, every, short = insert_jobs(db, 4, cron="* * * * *", accounts=accounts, grace=GRACE)
    catchup = "UPDATE jobs SET catchup_window_seconds = %s, catchup_all = %s, version = version + 1 WHERE id = %s"
    db.execute(catchup, (3600, False, newest))
    db.execute(catchup, (3600, True, every))
    db.execute(catchup, (120, True, short))
    jobs = {no_window, newest, every, short}
    first = await services.worker()
    await eventually(lambda: all_claimed(db, 4), 40, what="jobs claimed")

    b1 = int(clock.now()) + 30
    assert set(await fire_minute(clock, db, b1, workers=1, expected=jobs)) == jobs

    # The only worker stops; nobody fires b1+60 … b1+300. The next worker comes 330 s after b1.
    await services.stop_dead(first)
    clock.advance_to(b1 + 330)
    second = await services.worker()
    await eventually(
        lambda: (
            all(w == second.worker.worker_id and s == "claimed" for w, s in ownership(db).values())
            and len(ownership(db)) == 4
        ),
        40,
        what="the jobs taken over by the new worker",
    )
    heap = second.worker.heap
    await eventually(
        lambda: all((job := heap.get(j)) is not None and job.next_fire == b1 + 360 for j in jobs),
        20,
        what="every catch-up fire taken",
    )
    missed = [b1 + 60 * i for i in range(1, 6)]
    await eventually(lambda: _runs(db, every) == [b1, *missed], 10, what="the runs of every missed fire")

    # No window: the grace alone, and every fire it did not reach is a skipped occurrence.
    assert _runs(db, no_window) == [b1]
    skipped = _skipped(db, no_window)
    assert sorted(skipped) == missed
    assert {reason for reason, _ in skipped.values()} == {"missed"}
    assert "270 s late" in skipped[b1 + 60][1] and "beyond the job's catch-up window (0 s)" in skipped[b1 + 60][1]

    # A window, the newest only: one catch-up run; the older ones in it are recorded as skipped.
    assert _runs(db, newest) == [b1, b1 + 300]
    skipped = _skipped(db, newest)
    assert sorted(skipped) == missed[:-1]
    assert "a newer missed occurrence was queued instead" in skipped[b1 + 60][1]

    # catchup_all: a run for every missed fire, nothing skipped.
    assert _skipped(db, every) == {}

    # A window of 120 s: the fires at most that late run, the older ones are skipped.
    assert _runs(db, short) == [b1, b1 + 240, b1 + 300]
    skipped = _skipped(db, short)
    assert sorted(skipped) == missed[:3]
    assert "beyond the job's catch-up window (120 s)" in skipped[b1 + 180][1]
    assert duplicate_keys(db) == 0
