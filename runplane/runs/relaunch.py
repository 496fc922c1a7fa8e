"""A launch that failed, or a runner that never started: back to queued with backoff, or an error.

Used by dispatchers (the launcher raised), by the scheduler loop's reaper (the runner never claimed
the run within the start timeout) and by the Kubernetes Pod watcher (the run's Pod failed before its
runner claimed the run). All are infrastructure failures: the same run is launched again after
:func:`runplane.basics.backoff.ceiling` of its launch attempts; when the launch budget
(``settings.scheduler.launch_attempts``) is spent, the run ends in error and the job's retry budget
decides whether a new run follows (:mod:`runplane.runs.retries`).

A runner that dies after it claimed the run is not relaunched: its lease expires and the scheduler
loop's reaper ends the run "runner lost" (``scheduler/loop.py``), which the job may retry.
"""

from __future__ import annotations

import logging

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.bus import Bus
from runplane.adapters.db import Connection
from runplane.basics.backoff import ceiling
from runplane.basics.settings import Settings
from runplane.basics.types import FailureKind, Outcome, RunStatus
from runplane.runs.finish import end_run, finish_run
from runplane.runs.retries import RetryPolicy
from runplane.runs.transitions import TRANSITIONS

log = logging.getLogger(__name__)

Q = TRANSITIONS


def relaunch_delay(settings: Settings, launch_attempts: int, retry_after: float | None = None) -> float:
    """Exponential in the attempts made so far; a launcher's own hint wins when it is longer."""
    return max(ceiling(settings.scheduler.launch_backoff, launch_attempts), retry_after or 0.0)


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


async def runner_never_started(
    conn: Connection, settings: Settings, *, run_id: int, launch_attempts: int, reason: str, policy: RetryPolicy
) -> bool:
    """The run's runner died before it claimed the run (its Pod failed): relaunch or end it in error.

    Inside the caller's transaction, with the run row locked in ``starting``; ``launch_attempts``
    counts the failed launch. False when the run was no longer starting.
    """
    if launch_attempts < settings.scheduler.launch_attempts:
        await conn.execute(
            Q["requeue_after_pod_failure"],
            {
                "run_id": run_id,
                "launch_attempts": launch_attempts,
                "delay": ceiling(settings.scheduler.launch_backoff, launch_attempts),
                "reason": reason,
            },
        )
        return True
    await conn.execute(Q["count_pod_launch"], {"run_id": run_id, "launch_attempts": launch_attempts})
    outcome = Outcome.error(
        f"pod failed before the runner started ({launch_attempts} launch attempts): {reason}",
        FailureKind.INFRASTRUCTURE,
    )
    return await finish_run(conn, run_id, outcome, policy=policy, from_statuses=(RunStatus.STARTING,)) is not None
