"""The scheduler loop: every interval, a Pickup per account with due queued runs, and the reaper.

Reaping: a run ``starting`` longer than the start timeout never got a runner, so it is relaunched
(queued again with backoff) or, with its launch budget spent, ended in error; a run ``running``
whose lease expired lost its runner and ends in error "runner lost" (retried when the job allows).
Everything here is a hint or a compare-and-set, so several loops may run at once without harm.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from runplane import instruments
from runplane.bus import AmqpBus, Bus, Topology
from runplane.db import Connection, open_pool
from runplane.errors import ServiceUnavailable
from runplane.runs.finish import RUNNER_LOST, Outcome, end_run
from runplane.runs.pickups import PendingPickups, pending_pickup_ttl_ms, send_pickups
from runplane.runs.relaunch import launch_failed
from runplane.runs.retries import FailureKind, RetryPolicy
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.supervise import sleep_or_stop
from runplane.types import RunStatus
from scheduler.metrics import observe_runs

log = logging.getLogger(__name__)

Q = load_queries("scheduler")

REAP_BATCH = 500
FORGET_DISPATCHER_AFTER = 60.0


class SchedulerLoop:
    def __init__(
        self, settings: Settings, pool: AsyncConnectionPool[Connection], bus: Bus, pending: PendingPickups
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._bus = bus
        self._pending = pending
        self._topology = Topology(settings.bus_prefix)

    async def run_once(self) -> dict[str, int]:
        """One pass: pickups, then reaping. Returns what it did, for logs and tests."""
        pickups = await self.send_pickups()
        relaunched, stuck_failed = await self.reap_starting()
        lost = await self.reap_lost()
        await self.observe()
        observed = await observe_runs(self._pool)
        return {
            "pickups": pickups, "relaunched": relaunched, "start_failed": stuck_failed, "lost": lost,
            "observed": observed,
        }  # fmt: skip

    async def send_pickups(self) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["accounts_with_due_runs"])
            due = [int(row["account_id"]) for row in await cur.fetchall()]  # type: ignore[call-overload]
        accounts = await self._pending.mark(due)  # not those whose last Pickup still waits
        return await send_pickups(self._bus, self._topology, accounts, source="scheduler")

    async def observe(self) -> None:
        """Gauges of the whole system, and forgetting dispatchers that stopped announcing themselves."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["run_gauges"])
            gauges = await cur.fetchone()
            await conn.execute(Q["forget_silent_dispatchers"], {"silent_seconds": FORGET_DISPATCHER_AFTER})
        if gauges is not None:
            instruments.queued_runs.set(int(gauges["queued"]))  # type: ignore[call-overload]
            instruments.running_runs.set(int(gauges["running"]))  # type: ignore[call-overload]
            instruments.slots_in_use.set(int(gauges["slots_in_use"]))  # type: ignore[call-overload]
            instruments.oldest_queued_age.set(float(gauges["oldest_queued_age"]))  # type: ignore[arg-type]

    async def reap_starting(self) -> tuple[int, int]:
        timeout = self._settings.scheduler.start_timeout
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["stuck_starting"], {"start_timeout": timeout, "limit": REAP_BATCH})
            stuck = await cur.fetchall()
        relaunched = failed = 0
        for row in stuck:
            attempts = int(row["launch_attempts"])  # type: ignore[call-overload]
            log.warning("run stuck in starting", extra={"run_id": row["id"], "launch_attempts": attempts})
            await launch_failed(
                self._pool,
                self._bus,
                self._settings,
                run_id=int(row["id"]),  # type: ignore[call-overload]
                launch_attempts=attempts,
                message=f"no runner claimed the run within {timeout:g} s",
            )
            if attempts < self._settings.scheduler.launch_attempts:
                relaunched += 1
            else:
                failed += 1
        return relaunched, failed

    async def reap_lost(self) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["lost_running"], {"limit": REAP_BATCH})
            lost = await cur.fetchall()
        policy = RetryPolicy.from_settings(self._settings.runner)
        ended = 0
        for row in lost:
            finished = await end_run(
                self._pool,
                self._bus,
                self._settings.bus_prefix,
                int(row["id"]),  # type: ignore[call-overload]
                Outcome.error(RUNNER_LOST, FailureKind.INFRASTRUCTURE),
                policy=policy,
                from_statuses=(RunStatus.RUNNING,),
                require_lease_expired=True,  # a heartbeat that just arrived wins
            )
            ended += finished is not None
        return ended


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """``runplane scheduler``: a pass every ``settings.scheduler.interval`` until ``stop`` is set."""
    pool = await open_pool(settings.database_url, min_size=1, max_size=4, name="scheduler")
    pending = PendingPickups.from_url(
        settings.redis_url, prefix=settings.redis_prefix, ttl_ms=pending_pickup_ttl_ms(settings)
    )
    bus: AmqpBus | None = None
    try:
        bus = await AmqpBus.connect(settings.amqp_url)
        loop = SchedulerLoop(settings, pool, bus, pending)
        failures = 0
        while not stop.is_set():
            try:
                done = await loop.run_once()
                failures = 0
                if done["relaunched"] or done["start_failed"] or done["lost"]:
                    log.info("reaped", extra=done)
            except (ServiceUnavailable, psycopg.OperationalError) as exc:
                # Postgres or RabbitMQ away: keep trying every interval; the pass is idempotent.
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("scheduler pass failed", extra={"error": str(exc), "failures": failures})
            if await sleep_or_stop(stop, settings.scheduler.interval):
                break
    finally:
        if bus is not None:
            await bus.close()
        await pending.close()
        await pool.close()
