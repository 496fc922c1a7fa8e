"""The scheduler loop: every interval, a Pickup per account with due queued runs, the reaper
(``reaper.py``), gauges, and the run-lifecycle metrics (``metrics.py``).

Everything here is a hint or a compare-and-set, so several loops may run at once without harm.
"""

from __future__ import annotations

import asyncio
import logging

from psycopg_pool import AsyncConnectionPool

from runplane import instruments
from runplane.bus import AmqpBus, Bus, Topology
from runplane.db import Connection, open_pool
from runplane.errors import ServiceUnavailable
from runplane.runs.pickups import PendingPickups, pending_pickup_ttl_ms, send_pickups
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.supervise import sleep_or_stop
from scheduler.metrics import observe_runs
from scheduler.reaper import reap_lost, reap_starting

log = logging.getLogger(__name__)

Q = load_queries("scheduler")

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
        relaunched, stuck_failed = await reap_starting(self._pool, self._bus, self._settings)
        lost = await reap_lost(self._pool, self._bus, self._settings)
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
            except ServiceUnavailable as exc:
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
