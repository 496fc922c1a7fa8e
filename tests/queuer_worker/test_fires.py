"""Cron runs queued by a leader and queuer workers across two minute boundaries of a fake clock.

The services run in this process, on the real Postgres and RabbitMQ, all reading one wall clock that
the test moves (the leader's liveness checks keep real time). One scenario:

- boundary 1, normal operation: every job due is queued once, not before its boundary, and a Pickup
  goes out for each account; updates made just before (cron, time zone, deactivate, soft and hard
  delete) were applied by the owners and decide what fires.
- boundary 2, under churn: a worker stops dead (no drain, no goodbye) one second before it and a
  fourth worker joins around it. The dead worker's jobs are reassigned within 3 heartbeat intervals,
  its fire that fell in the gap is queued exactly once, the jobs are rebalanced within ±10%, and no
  fire is missed or duplicated across the moves. (A worker killed with SIGKILL at a real minute:
  ``tests/faults``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from psycopg_pool import AsyncConnectionPool

from orchestrator import service as orchestrator
from queuer_worker.runs_store import PostgresRunsStore
from queuer_worker.worker import QueuerWorker
from runplane.adapters.bus import AmqpBus
from runplane.adapters.db import Connection, open_pool
from runplane.basics.settings import Settings
from tests.support.pickups import waiting_pickup_accounts
from tests.support.polling import eventually
from tests.support.queuer import (
    NEVER_SOON,
    Db,
    all_claimed,
    claimed_counts,
    delete_queues,
    duplicate_keys,
    fire_minute,
    insert_accounts,
    insert_jobs,
    ownership,
    runs_at,
    update_job,
    within,
    workers_agree,
)
from tests.support.wall_clock import FakeClock

pytestmark = pytest.mark.slow  # a leader and four workers: about ten seconds

HEARTBEAT = 1.0
EVERY_MINUTE = "* * * * *"


@dataclass
class Worker:
    worker: QueuerWorker
    task: asyncio.Task[None]
    bus: AmqpBus
    pool: AsyncConnectionPool[Connection]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False


class Services:
    """A leader and queuer workers in this process, on one fake wall clock."""

    def __init__(self, settings: Settings, clock: FakeClock) -> None:
        self.settings = settings
        self.clock = clock
        self.stop = asyncio.Event()
        self.leader = asyncio.create_task(orchestrator.serve(settings, self.stop, wall_clock=clock), name="leader")
        self.workers: list[Worker] = []

    async def worker(self) -> Worker:
        pool = await open_pool(self.settings.database_url, max_size=4)
        bus = await AmqpBus.connect(self.settings.amqp_url)
        worker = QueuerWorker(
            self.settings, bus, PostgresRunsStore(pool), f"worker-{len(self.workers)}", wall_clock=self.clock
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop), name=worker.worker_id)
        self.workers.append(Worker(worker, task, bus, pool, stop))
        return self.workers[-1]

    @staticmethod
    async def stop_dead(worker: Worker) -> None:
        """Stop a worker the way a crash does: its tasks end mid-step, its connections just close."""
        worker.dead = True
        worker.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker.task
        await worker.bus.close()
        await worker.pool.close()

    async def close(self) -> None:
        live = [w for w in self.workers if not w.dead]
        self.stop.set()
        for w in live:
            w.stop.set()
        await asyncio.wait_for(asyncio.gather(self.leader, *(w.task for w in live)), 30)
        for w in live:
            await w.bus.close()
            await w.pool.close()
        await delete_queues(self.settings.bus_prefix, [w.worker.worker_id for w in self.workers])


@pytest.fixture
def clock() -> FakeClock:
    """Thirty seconds before a minute that has passed: fires in the past of the database."""
    return FakeClock(time.time() // 60 * 60 - 30)


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


async def pickups(settings: Settings) -> set[int]:
    """Accounts named by the Pickups waiting on the pickup queue (nobody consumes it here)."""
    return set(await waiting_pickup_accounts(settings))


async def test_cron_runs_on_time_through_updates_failover_and_rebalancing(
    services: Services, clock: FakeClock, db: Db, settings: Settings
) -> None:
    accounts = insert_accounts(db, 10)
    steady = insert_jobs(db, 300, cron=EVERY_MINUTE, accounts=accounts)
    to_yearly, to_deactivate, to_soft_delete, to_hard_delete = insert_jobs(db, 4, cron=EVERY_MINUTE, accounts=accounts)
    to_every_minute = insert_jobs(db, 1, cron=NEVER_SOON, accounts=accounts)[0]
    workers = [await services.worker() for _ in range(3)]
    await eventually(lambda: all_claimed(db, 305) and workers_agree(db), 40, what="jobs claimed")

    b1 = clock.now() + 30
    # Fires at minute (b1 + 30) of every hour in UTC: in Asia/Kolkata (UTC+05:30) that is b1 itself.
    kolkata_minute = (int(b1) // 60 + 30) % 60
    to_kolkata = insert_jobs(db, 1, cron=f"{kolkata_minute} * * * *", accounts=accounts)[0]
    await eventually(lambda: all_claimed(db, 306) and workers_agree(db), 10, what="the new job claimed")

    # -- updates, applied by the owners ------------------------------------------------------------
    update_job(db, to_yearly, cron=NEVER_SOON, at=clock.now())
    update_job(db, to_every_minute, cron=EVERY_MINUTE, at=clock.now())
    update_job(db, to_kolkata, timezone="Asia/Kolkata", at=clock.now())
    db.execute("UPDATE jobs SET deactivated_at = now(), version = version + 1 WHERE id = %s", (to_deactivate,))
    db.execute("UPDATE jobs SET deleted_at = now(), version = version + 1 WHERE id = %s", (to_soft_delete,))
    db.execute("DELETE FROM jobs WHERE id = %s", (to_hard_delete,))
    gone = {to_deactivate, to_soft_delete, to_hard_delete}
    await eventually(
        lambda: gone.isdisjoint(ownership(db)) and all_claimed(db, 303) and workers_agree(db),
        10,
        what="the owners to apply the updates",
    )

    # -- boundary 1: on time -----------------------------------------------------------------------
    expected = {*steady, to_every_minute, to_kolkata}
    fired = await fire_minute(clock, db, b1, workers=3, expected=expected)
    assert set(fired) == expected  # nothing for the yearly, deactivated or deleted jobs
    assert set(fired.values()) == {1}
    assert await pickups(settings) >= set(accounts)

    # -- boundary 2: a worker dies just before it, another joins around it -------------------------
    b2 = b1 + 60
    victim = workers[0]
    clock.advance_to(b2 - 3.0)
    await services.worker()
    clock.advance_to(b2 - 1.0)
    victim_jobs = {j for j, (w, _) in ownership(db).items() if w == victim.worker.worker_id}
    assert victim_jobs
    await services.stop_dead(victim)
    clock.advance_to(b2)
    # Silent for 3 intervals plus the detection tick: about 4 s of real time when the processes get
    # the CPU. The gap fire below is what is promised, not that latency: a machine busy with other
    # work delays the heartbeats and the leader's tick alike, so the wait allows for it.
    await eventually(
        lambda: victim.worker.worker_id not in {w for w, _ in ownership(db).values()},
        10 * (3 * HEARTBEAT + 1.0),
        what="the dead worker's jobs to be reassigned",
    )

    expected_b2 = {*steady, to_every_minute}
    await eventually(lambda: set(runs_at(db, b2)) >= expected_b2, 20, what="runs at boundary 2")
    await eventually(
        lambda: len(claimed_counts(db)) == 3 and within(claimed_counts(db), 303 / 3) and workers_agree(db),
        30,
        what="rebalanced over the three live workers",
    )
    fired = runs_at(db, b2)
    assert set(fired) - {to_kolkata} == expected_b2  # the gap fire of the dead worker's jobs too
    assert set(fired.values()) == {1}
    assert victim_jobs & set(fired)
    assert duplicate_keys(db) == 0
    assert all(runs_at(db, b1)[j] == 1 for j in expected)
