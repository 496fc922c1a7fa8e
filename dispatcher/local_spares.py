"""The local launcher's warm pool: runners the fork server keeps started and waiting (its spares).

One machine runs every kind of run, so the local pool serves them all: it follows the whole forecast
and the whole due queue (``dispatcher/pool_sizing.py``), its share of them when other live local
dispatchers of the same cluster serve them too, between ``dispatcher.local_spares_min`` and
``local_spares_max``. Ahead of a minute with runs due (``local_lead_seconds`` before it, longer when
the spares the peak lacks cannot be forked in time at ``FORK_RATE``), the fork server is asked for
that many spares; after the minute they go back to the minimum.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from dispatcher.local_launcher import POOL_NAME, LocalLauncher
from dispatcher.pool_sizing import PoolPlan, plan_pool, record_plan
from runplane.adapters.db import Connection, fetch_one
from runplane.basics import supervise
from runplane.basics.errors import LaunchError, ServiceUnavailable
from runplane.basics.settings import Settings
from runplane.basics.wall_clock import SYSTEM_CLOCK, WallClock
from runplane.demand.forecast import read_forecast
from runplane.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("dispatcher")
# Spares the fork server starts per second (a fork of the pre-loaded server, its child's connection
# to the runner API), on a busy two-core machine: only decides how far ahead a large peak is warmed.
FORK_RATE = 50.0


@dataclass(frozen=True, slots=True)
class _LocalDemand:
    """What the spares serve (``local_demand``): due queued runs, and the other local dispatchers here."""

    queued: int
    others: int


class LocalSpares:
    """Sizes the fork server's spares to the forecast and the queue. Run ``run(stop)`` as a task."""

    def __init__(
        self,
        settings: Settings,
        db: AsyncConnectionPool[Connection],
        launcher: LocalLauncher,
        dispatcher_id: str,
        *,
        wall_clock: WallClock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._dispatcher_id = dispatcher_id
        self._db = db
        self._launcher = launcher
        self._clock = wall_clock
        self.spares = 1  # what the fork server keeps (it starts with one)
        self.plan: PoolPlan | None = None  # the last look (observability and tests)

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            try:
                await self.keep()
            except (ServiceUnavailable, LaunchError) as exc:
                log.warning("local spares not sized this time", extra={"error": str(exc)})
            if await supervise.sleep_or_stop(stop, self._settings.dispatcher.local_pool_interval):
                return

    async def keep(self) -> None:
        """One look: read the forecast and the queue, and ask the fork server for the size they need."""
        config, forecast = self._settings.dispatcher, self._settings.forecast
        now = self._clock.now()
        async with self._db.connection() as conn:
            demand = await read_forecast(
                conn, now=now, stale_after=forecast.stale_after, api_window=forecast.api_window
            )
            params = {
                "cluster": config.cluster,
                "dispatcher_id": self._dispatcher_id,
                "dead_after": config.heartbeat_interval * config.dead_after_beats,
            }
            row = await fetch_one(conn, QUERIES["local_demand"], params, _LocalDemand)
        queued = row.queued if row is not None else 0
        dispatchers = 1 + (row.others if row is not None else 0)
        plan = plan_pool(
            demand,
            lambda _kind: True,
            now=now,
            lead=config.local_lead_seconds,
            idle=self.spares,
            queued=queued,
            min_size=config.local_spares_min,
            max_size=config.local_spares_max,
            create_rate=FORK_RATE,
            horizon_minutes=forecast.minutes,
            share=dispatchers,
        )
        self.plan = plan
        if plan.target != self.spares:
            if not await self._launcher.set_spares(plan.target):
                return
            log.info("local spares resized", extra={"spares": plan.target, "forecast": plan.forecast})
            self.spares = plan.target
        record_plan(plan, pool=POOL_NAME, cluster=self._settings.dispatcher.cluster, idle=self.spares)
