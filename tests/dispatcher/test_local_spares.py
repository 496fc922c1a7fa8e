"""The local launcher's warm pool on a fake clock: the fork server's started runners (real processes)
grow to a minute's forecast its lead time before the minute and go back to the minimum after; a
run taken meanwhile is given to one runner only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatcher.local_launcher import LocalLauncher
from dispatcher.local_spares import LocalSpares
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.demand.forecast import MINUTE
from tests.support.local_runs import ended, fork_server_of_this_process, starting_run, waiting_spares
from tests.support.polling import eventually
from tests.support.records import Conn, rows
from tests.support.wall_clock import FakeClock

pytestmark = [pytest.mark.usefixtures("_cleanup_bus", "runner_api"), pytest.mark.timeout(90)]

PEAK = 1_900_000_020 // MINUTE * MINUTE  # a minute far from the real clock: only the forecast names it


def waiting_spare_count(settings: Settings) -> int:
    """Started runners of this test's fork server waiting for a run (nothing here gives them one)."""
    return len(waiting_spares(fork_server_of_this_process(), settings.runner.api_address))


def forecast(db: Conn, minute: int, fires: int) -> None:
    db.execute(
        "INSERT INTO demand_forecast (worker_id, dbt_version, memory_mb, minute, fires) VALUES ('w', '', 1024, %s, %s)",
        (minute, fires),
    )


@pytest.fixture
async def spares(settings: Settings, database_url: str) -> AsyncIterator[tuple[LocalSpares, LocalLauncher, FakeClock]]:
    settings = settings.model_copy(
        update={
            "dispatcher": settings.dispatcher.model_copy(
                update={"local_spares_min": 1, "local_spares_max": 5, "local_lead_seconds": 20}
            )
        }
    )
    launcher = LocalLauncher(settings)
    db = await open_pool(database_url, max_size=2)
    clock = FakeClock(PEAK - 45)
    try:
        await launcher.start()
        yield LocalSpares(settings, db, launcher, "this-dispatcher", wall_clock=clock), launcher, clock
    finally:
        await launcher.close()
        await db.close()


async def test_spares_grow_before_the_minute_and_shrink_after(
    spares: tuple[LocalSpares, LocalLauncher, FakeClock], db: Conn, settings: Settings
) -> None:
    keeper, launcher, clock = spares
    forecast(db, PEAK, 4)
    forecast(db, PEAK + 3 * MINUTE, 9)  # beyond the lead time until then; more than the maximum

    await keeper.keep()
    assert keeper.spares == 1
    await eventually(lambda: waiting_spare_count(settings) == 1, 20, what="one spare")

    clock.advance_to(PEAK - 20)  # the lead time before the peak
    await keeper.keep()
    assert keeper.plan is not None and (keeper.plan.forecast, keeper.plan.target) == (4, 4)
    await eventually(lambda: waiting_spare_count(settings) == 4, 20, what="four spares before the minute")

    request = starting_run(db, ["true"])  # a run during the peak takes one spare, which is refilled
    await launcher.launch(request)
    assert (await ended(db, request.run_id))["status"] == RunStatus.SUCCESS
    assert len(rows(db, "SELECT 1 FROM run_steps WHERE run_id = %s", (request.run_id,))) == 1

    clock.advance_to(PEAK + MINUTE)  # the minute is over, nothing queued
    await keeper.keep()
    assert keeper.plan is not None and keeper.plan.target == 1
    await eventually(lambda: waiting_spare_count(settings) == 1, 20, what="back to one spare after the minute")

    clock.advance_to(PEAK + 3 * MINUTE - 20)
    await keeper.keep()
    assert keeper.spares == 5  # the forecast of 9, bounded by the maximum


async def test_local_dispatchers_of_one_cluster_share_the_forecast(
    spares: tuple[LocalSpares, LocalLauncher, FakeClock], db: Conn
) -> None:
    keeper, _, clock = spares
    forecast(db, PEAK, 5)
    db.execute(
        "INSERT INTO dispatchers (dispatcher_id, cluster, launcher) VALUES ('other', 'local', 'local'),"
        " ('this-dispatcher', 'local', 'local'), ('gone', 'local', 'local'), ('pods', 'local', 'kubernetes')"
    )
    db.execute("UPDATE dispatchers SET last_seen_at = now() - interval '1 hour' WHERE dispatcher_id = 'gone'")
    clock.advance_to(PEAK - 20)
    await keeper.keep()
    assert keeper.plan is not None and keeper.plan.target == 3  # its half of five, rounded up
