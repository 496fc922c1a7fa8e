"""``PodOutcomes`` on Postgres: what the Pod watcher does to runs, as compare-and-set SQL.

Statements that find a Pod's run live in ``queries.sql``. What happens to the run is the run
lifecycle's: a Pod that failed before its runner claimed the run is relaunched or ends the run
(:func:`runplane.runs.relaunch.runner_never_started`); a Pod killed for memory, or one that failed
after its runner claimed the run ("runner lost"), ends it through
:func:`runplane.runs.finish.finish_run` like every other run's end (failure counts, deactivation,
retries, completion triggers). The scheduler loop's next pass publishes the pickups that follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.db import Connection, fetch_one, fetch_values
from runplane.basics.settings import Settings
from runplane.basics.types import MEMORY_LIMIT_ERROR, RUNNER_LOST, FailureKind, Outcome, RunId, RunStatus
from runplane.runs.finish import finish_run
from runplane.runs.relaunch import runner_never_started
from runplane.runs.retries import RetryPolicy
from runplane.sql import load_queries

QUERIES = load_queries("dispatcher.kubernetes")


@dataclass(frozen=True)
class _PodRun:
    id: RunId
    launch_attempts: int


class PostgresPodOutcomes:
    def __init__(self, pool: AsyncConnectionPool[Connection], settings: Settings) -> None:
        self._pool = pool
        self._settings = settings
        self._orphan_grace = settings.kubernetes.orphan_grace_seconds
        self._policy = RetryPolicy.from_settings(settings.runner)

    async def memory_limit_exceeded(self, run_id: RunId, pod_name: str) -> bool:
        """The Pod was OOMKilled: the run ends in error "memory limit error"."""
        statuses = (RunStatus.STARTING, RunStatus.RUNNING)
        async with self._pool.connection() as conn, conn.transaction():
            if await self._lock(conn, run_id, pod_name, statuses) is None:
                return False
            outcome = Outcome.error(MEMORY_LIMIT_ERROR, FailureKind.STEP)
            return await finish_run(conn, run_id, outcome, policy=self._policy, from_statuses=statuses) is not None

    async def failed_before_claim(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        """The Pod failed before its runner claimed the run: relaunch within the budget, else error."""
        reason = reason[:1000]
        async with self._pool.connection() as conn, conn.transaction():
            row = await self._lock(conn, run_id, pod_name, (RunStatus.STARTING,))
            if row is None:
                return False
            return await runner_never_started(
                conn,
                self._settings,
                run_id=run_id,
                launch_attempts=row.launch_attempts + 1,
                reason=reason,
                policy=self._policy,
            )

    async def runner_pod_failed(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        """The Pod the runner lives in failed after the claim: the runner is gone, the run ends
        "runner lost" now (with the Pod's reason) instead of when its lease runs out."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(QUERIES["lock_claimed_run_of_pod"], {"run_id": run_id, "pod_name": pod_name})
            if await cur.fetchone() is None:
                return False
            outcome = Outcome.error(f"{RUNNER_LOST}: its pod failed: {reason[:1000]}", FailureKind.INFRASTRUCTURE)
            statuses = (RunStatus.RUNNING,)
            return await finish_run(conn, run_id, outcome, policy=self._policy, from_statuses=statuses) is not None

    async def _lock(
        self, conn: Connection, run_id: RunId, pod_name: str, statuses: tuple[RunStatus, ...]
    ) -> _PodRun | None:
        params = {"run_id": run_id, "pod_name": pod_name, "statuses": [int(s) for s in statuses]}
        return await fetch_one(conn, QUERIES["lock_pod_run"], params, _PodRun)

    async def live_pods(self, pods: Sequence[tuple[RunId, str]]) -> set[str]:
        if not pods:
            return set()
        params = {
            "run_ids": [run_id for run_id, _ in pods],
            "names": [name for _, name in pods],
            "grace": self._orphan_grace,
        }
        async with self._pool.connection() as conn:
            return set(await fetch_values(conn, QUERIES["live_pods"], params, str))
