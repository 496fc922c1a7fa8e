"""A dispatcher's intake bound: the arithmetic without servers, then a dispatcher holding to its credit on
the real Postgres, Redis and RabbitMQ and handing the rest of a burst back as Pickups."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.intake import CreateRate, Intake, intake_bound
from dispatcher.service import Dispatcher
from runplane.adapters.bus import AmqpBus
from runplane.adapters.db import open_pool
from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.runs.pickups import pickup
from tests.support.launchers import HoldingLauncher
from tests.support.pickups import waiting_pickup_accounts
from tests.support.records import Conn, create_account, create_job, queue_run, rows


def test_the_bound_is_the_rate_over_the_horizon_within_the_room() -> None:
    assert intake_bound(room=None, rate=50.0, horizon=2.0) == 100
    assert intake_bound(room=30, rate=50.0, horizon=2.0) == 30  # the cluster's room is smaller
    assert intake_bound(room=500, rate=12.5, horizon=2.0) == 25
    assert intake_bound(room=500, rate=0.01, horizon=2.0) == 1  # a stalled cluster still tries one run
    assert intake_bound(room=0, rate=50.0, horizon=2.0) == 0  # a full cluster takes none
    assert intake_bound(room=-3, rate=50.0, horizon=2.0) == 0  # over capacity (Pods a watch saw late)
    assert intake_bound(room=None, rate=10.1, horizon=1.0) == 11  # rounded up


def test_the_create_rate_follows_each_batch_half_way() -> None:
    rate = CreateRate(40.0)
    assert rate.observe(20, 1.0) == pytest.approx(30.0)
    assert rate.observe(0, 10.0) == pytest.approx(15.0)  # a batch that created nothing (the API timed out)
    assert rate.observe(90, 1.0) == pytest.approx(52.5)
    assert rate.observe(1, 0.0) == pytest.approx(0.5 * 1000 + 0.5 * 52.5)  # timed at the shortest batch


async def test_credit_is_taken_given_back_and_settled_by_launches() -> None:
    room = [1000]
    intake = Intake(rate=10.0, horizon=2.0, room=lambda: room[0], cluster="east")
    assert intake.take() == 20
    assert intake.take() == 0  # a second consumer of the same process finds none
    intake.give_back(5)  # the pass started 15
    assert intake.credit() == 5
    intake.launched(15, started=15, seconds=0.5)  # 30/s measured: the rate moves to 20/s
    assert intake.rate.per_second == pytest.approx(20.0)
    assert intake.held == 0 and intake.credit() == 40
    room[0] = 7
    assert intake.take() == 7  # the cluster filled up meanwhile


async def test_a_batch_without_credit_waits_for_a_launch_to_end_then_gives_up_at_the_horizon() -> None:
    intake = Intake(rate=2.0, horizon=0.5, room=lambda: None)
    assert intake.take() == 1
    waiting = asyncio.create_task(intake.take_within(5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    intake.launched(1, started=1, seconds=0.1)  # 10/s: the bound grows to 3 (2 + 10) / 2 * 0.5
    assert await asyncio.wait_for(waiting, 1.0) == 3
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await intake.take_within(0.3) == 0  # nothing ends: none after the wait
    assert loop.time() - began >= 0.3


async def test_a_dispatcher_starts_its_credit_and_hands_the_other_accounts_back(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    accounts = [create_account(db, run_slots=2) for _ in range(10)]
    queued = {
        account: [queue_run(db, create_job(db, account, name=f"job {i}")) for i in range(2)] for account in accounts
    }
    launcher = HoldingLauncher()
    intake = Intake(rate=3.0, horizon=1.0, room=lambda: None)  # credit: three runs
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        dispatcher = Dispatcher(settings, pool, bus, locks, launcher, intake=intake)
        await dispatcher.on_pickups([pickup(accounts)])
        shed = await waiting_pickup_accounts(settings)
    finally:
        await bus.close()
        await pool.close()
    starting = [
        int(r["id"]) for r in rows(db, "SELECT id FROM runs WHERE status = %s ORDER BY id", (RunStatus.STARTING,))
    ]
    assert starting == sorted(r.run_id for r in launcher.requests)
    assert starting == [*queued[accounts[0]], queued[accounts[1]][0]]  # three runs, in account order
    # The account it started half of and every account it did not reach wait on the bus for another dispatcher.
    assert sorted(shed) == accounts[1:]
    assert intake.held == 0  # launched and settled
    assert intake.rate.per_second > 3.0  # three runs held in far less than a second
