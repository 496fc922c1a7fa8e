"""The queuer worker's port to the system of record: queue the runs of a tick (one run per
idempotency key and only under the schedule in force), record that a schedule never fires, and read
whether the leader has declared the worker dead.

``PostgresRunsStore`` is the real adapter (``queuer_worker.firing``); the deterministic simulator
runs the same worker against an in-memory twin with the same ``UNIQUE(idempotency_key)`` rule,
proved by a conformance test that runs the same checks on both.
"""

from __future__ import annotations

from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from queuer_worker.firing import (
    PreparedTick,
    TickResult,
    deactivate_never_fires,
    queue_runs,
    record_missed,
    worker_state,
)
from queuer_worker.heap import MissedFire
from runplane.adapters.db import Connection


class RunsStore(Protocol):
    async def queue_runs(self, tick: PreparedTick) -> TickResult:
        """Insert the runs of one tick, skipping every fire whose key was queued before and every
        job no longer schedulable; cancel the runs they supersede."""
        ...

    async def record_missed(self, missed: list[MissedFire]) -> int:
        """Record fires given up as skipped occurrences (reason ``missed``): only those with no run, of
        the schedule in force; how many were recorded."""
        ...

    async def deactivate_never_fires(self, job_id: int, version: int, cron: str, timezone: str) -> bool:
        """Record that a job's schedule has no next fire, as that job's error; True when this call did it."""
        ...

    async def worker_state(self, worker_id: str) -> str | None:
        """The worker's state as the leader recorded it ('alive', 'dead'); None before its first beat."""
        ...


class PostgresRunsStore:
    def __init__(self, pool: AsyncConnectionPool[Connection]) -> None:
        self.pool = pool

    async def queue_runs(self, tick: PreparedTick) -> TickResult:
        return await queue_runs(self.pool, tick)

    async def record_missed(self, missed: list[MissedFire]) -> int:
        return await record_missed(self.pool, missed)

    async def deactivate_never_fires(self, job_id: int, version: int, cron: str, timezone: str) -> bool:
        return await deactivate_never_fires(self.pool, job_id, version, cron, timezone)

    async def worker_state(self, worker_id: str) -> str | None:
        return await worker_state(self.pool, worker_id)
