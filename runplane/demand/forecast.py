"""The forecast of demand: how many runs are due per minute over the next minutes, by runner kind.

The future is known: every cron fire of the next minutes is in the queuer workers' heaps. Each
worker publishes what its heap will fire, aggregated per runner kind and minute
(``queuer_worker/forecast.py``; a jittered fire counts in the minute it is due, its job's offset
after the cron's instant, ``runplane.basics.jitter``), into ``demand_forecast`` (one set of rows per
worker, replaced whole each time). Readers sum the workers whose forecast is fresh and add API triggers' recent rate per
minute, then ask :meth:`Forecast.ahead`: the most runs due in one minute that starts within a lead
time from now (or is under way). The warm pools grow to that before the minute, and shrink after.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.db import Connection, fetch_all, transaction
from runplane.sql import load_queries

QUERIES = load_queries("runplane.demand", "forecast.sql")
MINUTE = 60


class RunnerKind(NamedTuple):
    """What a run's runner must be: the image (by the environment's dbt version) and the memory."""

    dbt_version: str  # empty: plain commands (the default image)
    memory_mb: int


def minute_of(ts: float) -> int:
    """The start of the minute holding ``ts`` (unix seconds)."""
    return math.floor(ts) // MINUTE * MINUTE


@dataclass(frozen=True, slots=True)
class _Fires:
    """Cron fires forecast for a runner kind and minute (``forecast``)."""

    dbt_version: str
    memory_mb: int
    minute: int
    fires: int


@dataclass(frozen=True, slots=True)
class _ApiRuns:
    """API-triggered runs of a runner kind queued over the last window (``api_runs``)."""

    dbt_version: str
    memory_mb: int
    runs: int


@dataclass(frozen=True, slots=True)
class _JobKind:
    """A job's runner kind (``runner_kinds``)."""

    job_id: int
    dbt_version: str
    memory_mb: int


@dataclass(frozen=True)
class Forecast:
    """Runs due per runner kind and minute (cron fires, plus API triggers' recent rate)."""

    fires: Mapping[RunnerKind, Mapping[int, int]] = field(default_factory=dict)  # kind -> minute -> fires
    api_per_minute: Mapping[RunnerKind, float] = field(default_factory=dict)

    def due(self, minute: int, fits: Callable[[RunnerKind], bool]) -> int:
        """Runs of the kinds that ``fits`` due in ``minute``."""
        kinds = set(self.fires) | set(self.api_per_minute)
        cron = sum(self.fires.get(kind, {}).get(minute, 0) for kind in kinds if fits(kind))
        api = sum(rate for kind, rate in self.api_per_minute.items() if fits(kind))
        return cron + math.ceil(api)

    def ahead(self, now: float, lead: float, fits: Callable[[RunnerKind], bool]) -> int:
        """The most runs of fitting kinds due in one minute that is under way or starts within ``lead``
        seconds: what a pool needs to hold from ``lead`` before that minute until it is over."""
        first = minute_of(now)
        last = minute_of(now + lead)
        return max(self.due(minute, fits) for minute in range(first, last + 1, MINUTE))

    def minutes(self) -> list[int]:
        return sorted({minute for by_minute in self.fires.values() for minute in by_minute})


async def read_forecast(conn: Connection, *, now: float, stale_after: float, api_window: float) -> Forecast:
    """The forecast as the fresh workers published it, from the current minute on, with API triggers'
    rate per minute over the last ``api_window`` seconds."""
    fires: dict[RunnerKind, dict[int, int]] = {}
    params = {"stale_after": stale_after, "from_minute": minute_of(now)}
    for row in await fetch_all(conn, QUERIES["forecast"], params, _Fires):
        fires.setdefault(RunnerKind(row.dbt_version, row.memory_mb), {})[row.minute] = row.fires
    api = {
        RunnerKind(row.dbt_version, row.memory_mb): row.runs * MINUTE / api_window
        for row in await fetch_all(conn, QUERIES["api_runs"], {"window": api_window}, _ApiRuns)
    }
    return Forecast(fires, api)


async def publish_forecast(
    pool: AsyncConnectionPool[Connection], worker_id: str, counts: Mapping[tuple[RunnerKind, int], int], *, now: float
) -> None:
    """Replace ``worker_id``'s forecast of the minutes after the current one with ``counts`` (fires per
    (kind, minute)), in one transaction. The current minute's rows stay as they were forecast before
    it began: by now its fires are being queued and are leaving the heap."""
    current = minute_of(now)
    keys = [key for key in counts if key[1] > current]
    async with transaction(pool) as conn:
        await conn.execute(QUERIES["withdraw"], {"worker_id": worker_id, "current_minute": current})
        await conn.execute(QUERIES["still_publishing"], {"worker_id": worker_id})
        if keys:
            await conn.execute(
                QUERIES["publish"],
                {
                    "worker_id": worker_id,
                    "dbt_versions": [kind.dbt_version for kind, _ in keys],
                    "memory_mbs": [kind.memory_mb for kind, _ in keys],
                    "minutes": [minute for _, minute in keys],
                    "fires": [counts[key] for key in keys],
                },
            )


async def runner_kinds(conn: Connection, job_ids: Iterable[int]) -> dict[int, RunnerKind]:
    """Each job's runner kind; a job that no longer exists is left out."""
    rows = await fetch_all(conn, QUERIES["runner_kinds"], {"job_ids": list(job_ids)}, _JobKind)
    return {row.job_id: RunnerKind(row.dbt_version, row.memory_mb) for row in rows}
