"""What this worker's heap will fire over the next minutes, per runner kind and minute.

:func:`fires_by_minute` reads the heap without changing it: jobs whose next fire falls inside the
window are grouped by (cron, zone, next fire, kind), and each group's fires after that are computed
once with the same cron maths the heap uses, so the cost is one pass over the jobs plus a little per
distinct schedule, not per job. A fire already due (the tick under way, a missed fire) counts in
the current minute.

:class:`Forecaster` keeps each job's runner kind (read from Postgres when first needed, again after
the job's Assign or Update, and all of them every ``forecast.kinds_refresh``) and publishes the
forecast every ``forecast.interval`` (``runplane/demand/forecast.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from psycopg_pool import AsyncConnectionPool

from queuer_worker.heap import OwnedJob
from runplane.adapters.db import Connection
from runplane.basics.cron import NeverFires, next_fire
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import ForecastSettings
from runplane.basics.supervise import sleep_or_stop
from runplane.demand.forecast import MINUTE, RunnerKind, minute_of, publish_forecast, runner_kinds

log = logging.getLogger(__name__)

Counts = Counter[tuple[RunnerKind, int]]  # (kind, minute) -> fires


def window(now: float, minutes: int) -> tuple[int, int]:
    """The forecast's span: from the start of the current minute, ``minutes`` minutes (end excluded)."""
    start = minute_of(now)
    return start, start + minutes * MINUTE


def fires_by_minute(jobs: Iterable[OwnedJob], kind_of: Mapping[int, RunnerKind], *, now: float, minutes: int) -> Counts:
    """Fires per (kind, minute) the heap holding ``jobs`` will make in the window; a job of unknown
    kind is left out. A fire counts in the minute it is due: its instant plus its job's jitter offset."""
    start, end = window(now, minutes)
    groups: Counter[tuple[str, str, int, int, RunnerKind]] = Counter()
    for job in jobs:
        if job.next_due < end and (kind := kind_of.get(job.job_id)) is not None:
            groups[job.cron, job.timezone, job.next_fire, job.offset, kind] += 1
    counts: Counts = Counter()
    for (cron, zone, first, offset, kind), jobs_in_group in groups.items():
        fire = first
        while fire + offset < end:
            counts[kind, max(start, minute_of(fire + offset))] += jobs_in_group
            try:
                fire = next_fire(cron, zone, fire)
            except NeverFires:
                break
    return counts


class Forecaster:
    """Publishes a worker's forecast; keeps the runner kinds of its jobs."""

    def __init__(self, settings: ForecastSettings, pool: AsyncConnectionPool[Connection], worker_id: str) -> None:
        self._settings = settings
        self._pool = pool
        self._worker_id = worker_id
        self._kinds: dict[int, RunnerKind] = {}
        self._interned: dict[RunnerKind, RunnerKind] = {}
        self._kinds_read_at = time.monotonic()
        self.published: Counts = Counter()  # the last forecast published (observability and tests)

    def forget(self, job_ids: Iterable[int]) -> None:
        """The jobs changed (Assign, Update, Revoke): their kind is read again when next needed."""
        for job_id in job_ids:
            self._kinds.pop(job_id, None)

    async def publish(self, jobs: Iterable[OwnedJob], now: float) -> Counts:
        """Compute and publish the forecast of ``jobs`` (the heap's) at ``now``."""
        if time.monotonic() - self._kinds_read_at > self._settings.kinds_refresh:
            self._kinds.clear()
            self._kinds_read_at = time.monotonic()
        _, end = window(now, self._settings.minutes)
        in_window = [job for job in jobs if job.next_due < end]
        unknown = [job.job_id for job in in_window if job.job_id not in self._kinds]
        if unknown:
            async with self._pool.connection() as conn:
                found = await runner_kinds(conn, unknown)
            for job_id, kind in found.items():
                self._kinds[job_id] = self._interned.setdefault(kind, kind)
        counts = fires_by_minute(in_window, self._kinds, now=now, minutes=self._settings.minutes)
        await publish_forecast(self._pool, self._worker_id, counts, now=now)
        self.published = counts
        return counts

    async def run(self, jobs: Callable[[], Iterable[OwnedJob]], now: Callable[[], float], stop: asyncio.Event) -> None:
        """Publish every ``interval`` until ``stop``; an outage skips a forecast, never stops the worker."""
        while not stop.is_set():
            try:
                await self.publish(list(jobs()), now())
            except ServiceUnavailable as exc:
                log.warning("forecast not published", extra={"worker_id": self._worker_id, "error": str(exc)})
            if await sleep_or_stop(stop, self._settings.interval):
                return
