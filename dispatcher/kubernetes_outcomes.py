"""``PodOutcomes`` on Postgres: what the Pod watcher does to runs, as compare-and-set SQL.

Statements live in ``kubernetes_queries.sql``. A run ended here gets its terminal status and
message; anything else that follows a run's end is the business of whoever reads terminal runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg_pool import AsyncConnectionPool

from runplane.db import Connection
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.types import RunId

QUERIES = load_queries("dispatcher", "kubernetes_queries.sql")


class PostgresPodOutcomes:
    def __init__(self, pool: AsyncConnectionPool[Connection], settings: Settings) -> None:
        self._pool = pool
        self._launch_budget = settings.scheduler.launch_attempts
        self._backoff = settings.scheduler.launch_backoff
        self._orphan_grace = settings.kubernetes.orphan_grace_seconds

    async def memory_limit_exceeded(self, run_id: RunId, pod_name: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(QUERIES["memory_limit_exceeded"], {"run_id": run_id, "pod_name": pod_name})
            return await cur.fetchone() is not None

    async def failed_before_claim(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        params = {
            "run_id": run_id,
            "pod_name": pod_name,
            "reason": reason[:1000],
            "launch_budget": self._launch_budget,
            "backoff": self._backoff,
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(QUERIES["failed_before_claim"], params)
            return await cur.fetchone() is not None

    async def live_pods(self, pods: Sequence[tuple[RunId, str]]) -> set[str]:
        if not pods:
            return set()
        params = {
            "run_ids": [run_id for run_id, _ in pods],
            "names": [name for _, name in pods],
            "grace": self._orphan_grace,
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(QUERIES["live_pods"], params)
            return {str(row["name"]) for row in await cur.fetchall()}
