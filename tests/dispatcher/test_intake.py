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


async def test_credit_is_taken_given_back_and_freed_as_launches_end() -> None:
    room = [1000]
    intake = Intake(rate=10.0, horizon=2.0, room=lambda: room[0], cluster="east")
    assert intake.take() == 20
    assert intake.take() == 0  # a second consumer of the same process finds none
    intake.give_back(5)  # the pass started 15
    assert intake.credit() == 5
    intake.launching(15, now=100.0)
    for i in range(14):
        intake.launch_ended(started=True, now=100.0 + 0.05 * i)
    assert intake.rate.per_second == pytest.approx(10.0)  # nothing measured yet: under a second in flight
    assert intake.held == 1 and intake.credit() == 19
    intake.launch_ended(started=True, now=100.5)  # the last one: 15 runs in 0.5 s, 30/s
    assert intake.rate.per_second == pytest.approx(20.0)
    assert intake.held == 0 and intake.credit() == 40
    room[0] = 7
    assert intake.take() == 7  # the cluster filled up meanwhile


def test_batches_in_flight_together_are_measured_together() -> None:
    intake = Intake(rate=10.0, horizon=1.0, room=lambda: None)
    intake.take()
    intake.launching(5, now=0.0)
    intake.launching(5, now=0.4)  # another consumer's batch, while the first is under way
    ended = [0.2 * (i + 1) for i in range(9)]  # ten runs in 2 s: 5/s, whatever batch each was in
    for at in ended:
        intake.launch_ended(started=True, now=at)
    assert intake.rate.per_second == pytest.approx(0.5 * 5 / 1.0 + 0.5 * 10.0)  # folded in after 1 s in flight
    intake.launch_ended(started=False, now=2.0)  # the last failed: 4 runs in the next 1 s
    assert intake.rate.per_second == pytest.approx(0.5 * 4 / 1.0 + 0.5 * 7.5)
    intake.abandon(0)
    assert intake.held == 0


async def test_a_batch_waits_for_half_the_bound_to_be_free_then_takes_what_there_is() -> None:
    intake = Intake(rate=4.0, horizon=1.0, room=lambda: None)
    assert intake.take() == 4
    intake.launching(4, now=0.0)
    waiting = asyncio.create_task(intake.take_within(5.0))
    intake.launch_ended(started=True, now=0.1)  # one free of four: not yet
    await asyncio.sleep(0.05)
    assert not waiting.done()
    intake.launch_ended(started=True, now=0.2)  # two of four: taken
    assert await asyncio.wait_for(waiting, 1.0) == 2
    assert intake.held == 4
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await intake.take_within(0.3) == 0  # nothing ends: none after the wait
    assert loop.time() - began >= 0.3
    intake.launch_ended(started=True, now=0.3)
    assert await intake.take_within(0.0) == 1  # past the wait: whatever there is


async def test_a_machine_of_known_capacity_takes_runs_in_batches_and_a_small_pickup_at_once() -> None:
    alive = [8]  # of a capacity of 8: the machine is full
    intake = Intake(rate=1000.0, horizon=5.0, room=lambda: 8 - alive[0], full=8)
    assert intake.batch() == 8 and intake.take() == 0
    waiting = asyncio.create_task(intake.take_within(5.0))
    alive[0] = 5  # three runners exited: fewer than half the capacity is free
    await asyncio.sleep(0.5)  # more than one look at the room
    assert not waiting.done()
    alive[0] = 4
    assert await asyncio.wait_for(waiting, 1.0) == 4
    intake.give_back(4)
    alive[0] = 7
    assert await asyncio.wait_for(intake.take_within(5.0, wanted=1), 0.5) == 1  # one account: no batch to wait for


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
