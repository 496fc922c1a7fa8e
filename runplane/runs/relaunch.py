"""A launch that failed, or a run stuck in starting: back to queued with backoff, or an error.

Used by dispatchers (the launcher raised) and by the scheduler loop's reaper (the runner never
claimed the run within the start timeout). Both are infrastructure failures: when the launch budget
is spent, the run ends in error and the job's retry budget decides whether a new run follows.
"""

from __future__ import annotations

import logging

from psycopg_pool import AsyncConnectionPool

from runplane.bus import Bus
from runplane.db import Connection
from runplane.runs.finish import FailureKind, Outcome, RetryPolicy, end_run
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.types import RunStatus

log = logging.getLogger(__name__)

Q = load_queries("runplane.runs", "transitions.sql")


def relaunch_delay(settings: Settings, launch_attempts: int, retry_after: float | None = None) -> float:
    """Exponential in the attempts made so far; a launcher's own hint wins when it is longer."""
    delay = settings.scheduler.launch_backoff * 2 ** max(0, launch_attempts - 1)
    return float(max(delay, retry_after or 0.0))


async def launch_failed(
    pool: AsyncConnectionPool[Connection],
    bus: Bus | None,
    settings: Settings,
    *,
    run_id: int,
    launch_attempts: int,
    message: str,
    retryable: bool = True,
    retry_after: float | None = None,
) -> None:
    """Requeue the run for another launch while attempts remain, else end it in error."""
    if retryable and launch_attempts < settings.scheduler.launch_attempts:
        async with pool.connection() as conn:
            cur = await conn.execute(
                Q["requeue_for_relaunch"],
                {
                    "run_id": run_id,
                    "launch_attempts": launch_attempts,
                    "delay": relaunch_delay(settings, launch_attempts, retry_after),
                    "message": f"launch attempt {launch_attempts} failed: {message}",
                },
            )
            requeued = await cur.fetchone()
        if requeued is not None:
            log.warning("launch failed; requeued", extra={"run_id": run_id, "launch_attempts": launch_attempts})
        return
    await end_run(
        pool,
        bus,
        settings.bus_prefix,
        run_id,
        Outcome.error(f"launch failed after {launch_attempts} attempts: {message}", FailureKind.INFRASTRUCTURE),
        policy=RetryPolicy.from_settings(settings.runner),
        from_statuses=(RunStatus.STARTING,),
    )
