"""A queuer worker on the real bus and Postgres: (term, clock) gating, firing at its minute and
missed-fire grace, on a wall clock the test moves."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import pytest
from google.protobuf.message import Message

from queuer_worker.runs_store import PostgresRunsStore
from queuer_worker.worker import QueuerWorker
from runplane.adapters.bus import AmqpBus, Topology
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2
from tests.support.pickups import waiting_pickup_accounts
from tests.support.polling import eventually
from tests.support.queuer import (
    NEVER_SOON,
    Db,
    delete_queues,
    duplicate_keys,
    fire_minute,
    insert_accounts,
    insert_jobs,
    runs_at,
    update_job,
)
from tests.support.wall_clock import FakeClock

EVERY_MINUTE = "* * * * *"


@dataclass
class Running:
    worker: QueuerWorker
    publisher: AmqpBus
    topology: Topology


@pytest.fixture
def clock() -> FakeClock:
    """Ten seconds before the start of the current minute: fires in the past of the database."""
    return FakeClock(time.time() // 60 * 60 - 10)


@pytest.fixture
async def running(settings: Settings, clock: FakeClock) -> AsyncIterator[Running]:
    # Ticks of a few dozen runs go in several chunks, each committed with its own Pickups.
    settings = settings.model_copy(update={"queuer": settings.queuer.model_copy(update={"insert_chunk": 7})})
    pool = await open_pool(settings.database_url, max_size=2)
    bus = await AmqpBus.connect(settings.amqp_url)
    publisher = await AmqpBus.connect(settings.amqp_url)
    worker = QueuerWorker(settings, bus, PostgresRunsStore(pool), "w-test", wall_clock=clock)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name="queuer-worker-under-test")
    try:
        yield Running(worker, publisher, Topology(settings.bus_prefix))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await publisher.close()
        await bus.close()
        await pool.close()
        await delete_queues(settings.bus_prefix, ["w-test"])


def definition(
    job_id: int, version: int, cron: str = NEVER_SOON, grace: int = 300, timezone: str = "UTC"
) -> bus_pb2.JobDefinition:
    return bus_pb2.JobDefinition(
        job_id=job_id, account_id=1, version=version, cron=cron, timezone=timezone, active=True,
        missed_run_grace_seconds=grace, job_type=1,
    )  # fmt: skip


def assign(job_id: int, stamp: Stamp, version: int, last_fire_ts: int = 0, **kw: Any) -> bus_pb2.Assign:
    job = bus_pb2.JobAssignment(
        job=definition(job_id, version, **kw), stamp=stamp.to_proto(), last_fire_ts=last_fire_ts
    )
    return bus_pb2.Assign(stamp=stamp.to_proto(), jobs=[job])


def update(job_id: int, stamp: Stamp, version: int, **kw: Any) -> bus_pb2.Update:
    job = bus_pb2.JobAssignment(job=definition(job_id, version, **kw), stamp=stamp.to_proto())
    return bus_pb2.Update(stamp=stamp.to_proto(), job=job)


def revoke(job_id: int, stamp: Stamp) -> bus_pb2.Revoke:
    return bus_pb2.Revoke(stamp=stamp.to_proto(), job_ids=[job_id])


def held(worker: QueuerWorker) -> dict[int, int]:
    """job_id -> version of everything the worker holds."""
    out = {}
    for job_id in worker.heap.job_ids():
        job = worker.heap.get(job_id)
        assert job is not None
        out[job_id] = job.version
    return out


async def test_shuffled_and_duplicated_messages_end_at_the_newest_stamp(running: Running) -> None:
    rng = random.Random(20260321)
    messages: list[tuple[str, Message]] = []
    expected: dict[int, int] = {}
    clock = 0
    for job_id in range(1, 31):
        kinds = ["assign"] + [rng.choice(["update", "revoke", "assign"]) for _ in range(rng.randint(1, 4))]
        for kind in kinds:
            clock += 1
            stamp = Stamp(2, clock)
            if kind == "assign":
                messages.append(("assign", assign(job_id, stamp, version=clock)))
            elif kind == "update":
                messages.append(("own", update(job_id, stamp, version=clock)))
            else:
                messages.append(("own", revoke(job_id, stamp)))
        if kinds[-1] == "revoke":
            expected.pop(job_id, None)
        else:
            expected[job_id] = clock
        # A leader of an older term said something else later in its own clock.
        messages.append(("assign", assign(job_id, Stamp(1, 10_000 + job_id), version=99_999)))
    messages += rng.sample(messages, 25)  # redeliveries
    rng.shuffle(messages)
    topo = running.topology
    for where, message in messages:
        queue = topo.assign if where == "assign" else topo.worker("w-test")
        await running.publisher.publish(queue, message)

    await eventually(lambda: held(running.worker) == expected, 20, what="the newest stamp per job")
    assert running.worker.gate.newest_term == 2

    # Once term 2 is seen, term 1 is ignored even for a job whose stamp it would otherwise beat; the
    # sentinel after it on the same queue proves it was read.
    some_job = next(iter(expected))
    await running.publisher.publish(topo.worker("w-test"), update(some_job, Stamp(1, 1_000_000), version=42))
    await running.publisher.publish(topo.worker("w-test"), update(500, Stamp(2, clock + 1), version=7))
    await eventually(lambda: 500 in held(running.worker), 10, what="the sentinel update")
    assert held(running.worker)[some_job] == expected[some_job]


async def test_after_drop_everything_an_older_assign_of_an_unseen_job_is_not_held(running: Running) -> None:
    # A worker declared dead is told to drop everything; an Assign the leader put on the shared queue
    # before that (and gave to another worker since, having refused this one's claim while it was
    # dead) must not be held here, unknown to the leader.
    topo = running.topology
    await running.publisher.publish(topo.assign, assign(1, Stamp(4, 1), version=1))
    await eventually(lambda: held(running.worker) == {1: 1}, 10, what="the first Assign")
    await running.publisher.publish(topo.worker("w-test"), bus_pb2.Revoke(stamp=Stamp(4, 10).to_proto(), drop_all=True))
    await eventually(lambda: not held(running.worker), 10, what="everything dropped")
    await running.publisher.publish(topo.assign, assign(2, Stamp(4, 5), version=1))  # sent before the drop
    await running.publisher.publish(topo.assign, assign(3, Stamp(4, 11), version=1))  # sent after it
    await eventually(lambda: 3 in held(running.worker), 10, what="the newer Assign")
    assert held(running.worker) == {3: 1}


async def test_missed_fire_within_grace_is_queued_once_on_takeover(running: Running, db: Db, clock: FakeClock) -> None:
    inside, _unassigned, no_grace, known = insert_jobs(db, 4, cron="* * * * *")
    yearly = insert_jobs(db, 1, cron=NEVER_SOON)[0]
    now = clock.now()
    previous = int(now) // 60 * 60
    stamp = Stamp(3, 1)
    jobs = [
        bus_pb2.JobAssignment(job=definition(inside, 1, "* * * * *", 300), stamp=stamp.to_proto()),
        # Its last fire (New Year) is far outside the 5 minute grace.
        bus_pb2.JobAssignment(job=definition(yearly, 1, NEVER_SOON, 300), stamp=stamp.to_proto()),
        bus_pb2.JobAssignment(job=definition(no_grace, 1, "* * * * *", 0), stamp=stamp.to_proto()),
        bus_pb2.JobAssignment(
            job=definition(known, 1, "* * * * *", 300), stamp=stamp.to_proto(), last_fire_ts=previous
        ),
    ]
    await running.publisher.publish(running.topology.assign, bus_pb2.Assign(stamp=stamp.to_proto(), jobs=jobs))
    await running.publisher.publish(running.topology.assign, bus_pb2.Assign(stamp=stamp.to_proto(), jobs=jobs))

    def missed_runs() -> list[tuple[int, int]]:
        return [
            (int(r[0]), int(r[1]))
            for r in db.execute(
                "SELECT job_id, extract(epoch FROM scheduled_at)::bigint FROM runs"
                " WHERE scheduled_at <= to_timestamp(%s)",
                (now,),
            )
        ]

    await eventually(missed_runs, 10, what="the missed fire")
    await eventually(lambda: len(held(running.worker)) == 4, 10, what="all four jobs held")
    # Exactly one run: the newest occurrence of the job taken within its grace, none for the others
    # (nor for ``_unassigned``, a job of the database this worker was never given).
    assert missed_runs() == [(inside, previous)]
    assert set(held(running.worker)) == {inside, yearly, no_grace, known}


async def test_due_jobs_are_queued_once_at_their_minute_and_not_before(
    running: Running, db: Db, settings: Settings, clock: FakeClock
) -> None:
    boundary = clock.now() + 10
    accounts = insert_accounts(db, 3)
    steady = insert_jobs(db, 30, cron=EVERY_MINUTE, accounts=accounts)
    to_yearly, to_every_minute, revoked, kolkata = insert_jobs(db, 4, cron=EVERY_MINUTE, accounts=accounts)
    # Minute (boundary + 30) of the hour in UTC is the boundary itself in Asia/Kolkata (UTC+05:30).
    kolkata_minute = (int(boundary) // 60 + 30) % 60
    # Postgres holds the schedules the messages below end with: a fire is queued only under the
    # schedule in force at its instant.
    update_job(db, kolkata, cron=f"{kolkata_minute} * * * *", timezone="Asia/Kolkata", at=clock.now())
    stamp = Stamp(2, 1)
    jobs = [
        bus_pb2.JobAssignment(job=definition(job_id, 1, EVERY_MINUTE), stamp=stamp.to_proto())
        for job_id in [*steady, to_yearly, revoked]
    ]
    jobs += [
        bus_pb2.JobAssignment(job=definition(to_every_minute, 1, NEVER_SOON), stamp=stamp.to_proto()),
        bus_pb2.JobAssignment(job=definition(kolkata, 1, f"{kolkata_minute} * * * *"), stamp=stamp.to_proto()),
    ]
    await running.publisher.publish(running.topology.assign, bus_pb2.Assign(stamp=stamp.to_proto(), jobs=jobs))
    own = running.topology.worker("w-test")
    await running.publisher.publish(own, update(to_yearly, Stamp(2, 2), version=2, cron=NEVER_SOON))
    await running.publisher.publish(own, update(to_every_minute, Stamp(2, 3), version=2, cron=EVERY_MINUTE))
    await running.publisher.publish(
        own, update(kolkata, Stamp(2, 4), version=2, cron=f"{kolkata_minute} * * * *", timezone="Asia/Kolkata")
    )
    await running.publisher.publish(own, revoke(revoked, Stamp(2, 5)))
    held_versions = {**dict.fromkeys(steady, 1), to_yearly: 2, to_every_minute: 2, kolkata: 2}
    await eventually(lambda: held(running.worker) == held_versions, 10, what="the assigns and updates applied")

    expected = {*steady, to_every_minute, kolkata}
    fired = await fire_minute(clock, db, boundary, workers=1, expected=expected)
    assert set(fired) == expected  # nothing for the job made yearly nor for the revoked one
    assert set(fired.values()) == {1}
    assert set(await waiting_pickup_accounts(settings)) == set(accounts)

    # The clock jumps past the next minute (the machine stalled): that fire is queued late, once.
    clock.advance_to(boundary + 65)
    late = await eventually(
        lambda: runs_at(db, boundary + 60), 10, until=lambda f: set(f) >= {*steady, to_every_minute}, what="late runs"
    )
    assert set(late) == {*steady, to_every_minute}
    assert duplicate_keys(db) == 0


async def queue_exists(amqp_url: str, name: str) -> bool:
    async with await aio_pika.connect(amqp_url) as connection:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except aio_pika.exceptions.ChannelClosed:  # NOT_FOUND closes the channel
            return False
        return True


async def test_a_worker_that_stops_takes_its_own_queue_with_it(settings: Settings) -> None:
    """Also when no leader ever heard from it (no row in queuer_workers: none would delete the queue)."""
    pool = await open_pool(settings.database_url, max_size=2)
    bus = await AmqpBus.connect(settings.amqp_url)
    worker = QueuerWorker(settings, bus, PostgresRunsStore(pool), "w-leaving")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name="queuer-worker-under-test")
    try:
        await eventually(lambda: queue_exists(settings.amqp_url, worker.own_queue), 10, what="the worker's queue")
        stop.set()
        await asyncio.wait_for(task, 10)
        assert not await queue_exists(settings.amqp_url, worker.own_queue)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
        await pool.close()
        await delete_queues(settings.bus_prefix, ["w-leaving"])
