"""The scheduler loop: every interval, a Pickup per account with due queued runs, the reaper
(``reaper.py``), gauges, and the run-lifecycle metrics (``metrics.py``); every
``pull_request_sweep_interval``, the sweep of old pull request schemas (``runplane.runs.pull_requests``);
every ``retention_interval``, the deletion of expired runs (``retention.py``).

Everything here is a hint or a compare-and-set, so several loops may run at once without harm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters import instruments
from runplane.adapters.bus import AmqpBus, Bus, Topology
from runplane.adapters.db import Connection, fetch_all, fetch_one, open_pool
from runplane.adapters.outages import Backoff, is_transient
from runplane.basics.settings import Settings
from runplane.basics.supervise import sleep_or_stop
from runplane.basics.types import AccountId
from runplane.runs.pickups import PendingPickups, pending_pickup_ttl_ms, send_pickups
from runplane.runs.pull_requests import sweep_pull_request_schemas
from runplane.sql import load_queries
from scheduler.metrics import observe_runs
from scheduler.on_time import OnTimeGauge
from scheduler.reaper import reap_lost, reap_starting
from scheduler.retention import delete_expired_runs

log = logging.getLogger(__name__)

Q = load_queries("scheduler")


@dataclass(frozen=True)
class _DueAccount:
    account_id: AccountId


@dataclass(frozen=True)
class _RunGauges:
    queued: int
    undecided: int
    running: int
    slots_in_use: int
    oldest_queued_age: float
    stuck: int


FORGET_DISPATCHER_AFTER = 60.0
# Seconds in a row dispatch may count as behind (``SchedulerLoop._behind``): run metrics wait and the
# sweep leaves cron runs to their queuers' Pickups for at most this long.
BEHIND_MAX = 60.0


class SchedulerLoop:
    def __init__(
        self, settings: Settings, pool: AsyncConnectionPool[Connection], bus: Bus, pending: PendingPickups
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._bus = bus
        self._pending = pending
        self._topology = Topology(settings.bus_prefix)
        self._on_time = OnTimeGauge(pool, settings.scheduler)
        self._next_sweep = 0.0  # monotonic: the first pass sweeps
        self._next_retention = 0.0
        self._behind_since: float | None = None  # monotonic: since when dispatch has been behind

    async def run_once(self) -> dict[str, int]:
        """One pass: gauges, pickups, reaping, metrics. Returns what it did, for logs and tests."""
        behind = self._behind(await self.observe())
        pickups = await self.send_pickups(behind=behind)
        relaunched, stuck_failed = await reap_starting(self._pool, self._bus, self._settings)
        lost = await reap_lost(self._pool, self._bus, self._settings)
        await self._on_time.observe_when_due()
        # Recording writes each run's row once more: while dispatch is behind, that write would cost
        # the database as much as starting the run. The rows keep every timestamp: the metrics come
        # late, never wrong.
        observed = (
            0 if behind else await observe_runs(self._pool, queued_after=self._settings.scheduler.observe_queued_after)
        )
        schema_drops = await self.sweep()
        expired = await self.retain()
        return {
            "pickups": pickups, "relaunched": relaunched, "start_failed": stuck_failed, "lost": lost,
            "observed": observed, "schema_drops": schema_drops, "runs_deleted": expired,
        }  # fmt: skip

    def _behind(self, undecided: int) -> bool:
        """Whether dispatch counts as behind: more than ``scheduler.behind_backlog`` due runs wait for
        a first dispatch decision (the top of the hour), for at most ``BEHIND_MAX`` seconds in a row."""
        if undecided <= self._settings.scheduler.behind_backlog:
            self._behind_since = None
            return False
        now = time.monotonic()
        if self._behind_since is None:
            self._behind_since = now
        return now - self._behind_since < BEHIND_MAX

    async def retain(self) -> int:
        """Delete bounded batches of expired runs, when the pass is due; how many runs went."""
        if time.monotonic() < self._next_retention:
            return 0
        deleted = await delete_expired_runs(self._pool)
        self._next_retention = time.monotonic() + self._settings.scheduler.retention_interval
        return deleted

    async def sweep(self) -> int:
        """Drop runs for the pull request schemas past their account's age, when the sweep is due."""
        if time.monotonic() < self._next_sweep:
            return 0
        drops = await sweep_pull_request_schemas(self._pool, self._bus, self._settings.bus_prefix)
        self._next_sweep = time.monotonic() + self._settings.scheduler.pull_request_sweep_interval
        if drops:
            log.info("old pull request schemas: drop runs queued", extra={"runs": [d.run_id for d in drops]})
        return len(drops)

    async def send_pickups(self, *, behind: bool = False) -> int:
        """A Pickup for every account with due runs whose last Pickup no longer waits.

        While dispatch is behind, the cron runs its queuers queued are left to their Pickups for
        ``BEHIND_MAX`` rather than ``scheduler.sweep_grace``: those Pickups are most likely still on
        the bus, and a second Pickup per account would double dispatch's work when it can least
        afford it. A lost one is made up once dispatch has caught up, or after ``BEHIND_MAX``."""
        grace = BEHIND_MAX if behind else self._settings.scheduler.sweep_grace
        async with self._pool.connection() as conn:
            rows = await fetch_all(conn, Q["accounts_with_due_runs"], {"grace": grace}, _DueAccount)
        due = [row.account_id for row in rows]
        accounts = await self._pending.mark(due)  # not those whose last Pickup still waits
        return await send_pickups(self._bus, self._topology, accounts, source="scheduler")

    async def observe(self) -> int:
        """Gauges of the whole system, and forgetting dispatchers that stopped announcing themselves.

        Returns how many due runs wait for a first dispatch decision."""
        async with self._pool.connection() as conn:
            gauges = await fetch_one(
                conn, Q["run_gauges"], {"start_timeout": self._settings.scheduler.start_timeout}, _RunGauges
            )
            await conn.execute(Q["forget_silent_dispatchers"], {"silent_seconds": FORGET_DISPATCHER_AFTER})
        if gauges is not None:
            instruments.queued_runs.set(gauges.queued)
            instruments.running_runs.set(gauges.running)
            instruments.slots_in_use.set(gauges.slots_in_use)
            instruments.oldest_queued_age.set(gauges.oldest_queued_age)
            instruments.stuck_runs.set(gauges.stuck)
            return gauges.undecided
        return 0


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
        backoff = Backoff(first=settings.scheduler.interval)
        while not stop.is_set():
            pause = settings.scheduler.interval
            try:
                done = await loop.run_once()
                backoff.reset()
                if done["relaunched"] or done["start_failed"] or done["lost"]:
                    log.info("reaped", extra=done)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                # Postgres, Redis or RabbitMQ away: try again after a bounded backoff; the pass is
                # idempotent.
                pause = backoff.next()
                if backoff.failures == 1 or backoff.failures % 30 == 0:
                    log.warning("scheduler pass failed", extra={"error": repr(exc), "failures": backoff.failures})
            if await sleep_or_stop(stop, pause):
                break
    finally:
        if bus is not None:
            await bus.close()
        await pending.close()
        await pool.close()
