"""The reaper: what happens to a run whose runner never came, or died.

- A run ``starting`` whose dispatcher stopped heartbeating (``dispatcher.dead_after_beats`` missed
  beats) will never be launched, and one ``starting`` longer than ``settings.scheduler.start_timeout``
  never got a runner: either is
  relaunched (queued again after a backoff) or, with its launch budget spent, ended in error
  (``runplane/runs/relaunch.py``).
- A run ``running`` whose lease expired lost its runner (the runner stopped heartbeating: killed,
  out of memory, its node gone): it ends in error "runner lost" (``runplane/runs/finish.py``), and
  the job's retry budget decides whether a new run follows (``runplane/runs/retries.py``). A
  heartbeat that arrives first wins: the end is a compare-and-set on the expired lease.

In Kubernetes the Pod watcher sees a runner's Pod die sooner (``dispatcher/kubernetes/watch.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.bus import Bus
from runplane.adapters.db import Connection, fetch_all
from runplane.basics.settings import Settings
from runplane.basics.types import RUNNER_LOST, FailureKind, Outcome, RunId, RunStatus
from runplane.runs.finish import end_run
from runplane.runs.relaunch import launch_failed
from runplane.runs.retries import RetryPolicy
from runplane.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("scheduler")

REAP_BATCH = 500


@dataclass(frozen=True)
class _StuckRun:
    id: RunId
    launch_attempts: int
    orphaned: bool | None  # its dispatcher stopped heartbeating (NULL when never dispatched)


@dataclass(frozen=True)
class _LostRun:
    id: RunId


async def reap_starting(pool: AsyncConnectionPool[Connection], bus: Bus, settings: Settings) -> tuple[int, int]:
    """Runs starting longer than the start timeout, or whose dispatcher stopped heartbeating before it
    launched them: relaunched, or ended once the launch budget is spent."""
    timeout = settings.scheduler.start_timeout
    dead_after = settings.dispatcher.heartbeat_interval * settings.dispatcher.dead_after_beats
    async with pool.connection() as conn:
        stuck = await fetch_all(
            conn,
            Q["stuck_starting"],
            {"start_timeout": timeout, "dead_after": dead_after, "limit": REAP_BATCH},
            _StuckRun,
        )
    relaunched = failed = 0
    for row in stuck:
        attempts = row.launch_attempts
        orphaned = bool(row.orphaned)
        log.warning(
            "run orphaned by a dead dispatcher" if orphaned else "run stuck in starting",
            extra={"run_id": row.id, "launch_attempts": attempts},
        )
        await launch_failed(
            pool,
            bus,
            settings,
            run_id=row.id,
            launch_attempts=attempts,
            message=(
                f"the dispatcher that started the run stopped heartbeating for {dead_after:g} s before a runner"
                " claimed it"
                if orphaned
                else f"no runner claimed the run within {timeout:g} s"
            ),
        )
        if attempts < settings.scheduler.launch_attempts:
            relaunched += 1
        else:
            failed += 1
    return relaunched, failed


async def reap_lost(pool: AsyncConnectionPool[Connection], bus: Bus, settings: Settings) -> int:
    """Running runs whose lease expired lost their runner: they end in error "runner lost"."""
    async with pool.connection() as conn:
        lost = await fetch_all(conn, Q["lost_running"], {"limit": REAP_BATCH}, _LostRun)
    policy = RetryPolicy.from_settings(settings.runner)
    ended = 0
    for row in lost:
        finished = await end_run(
            pool,
            bus,
            settings.bus_prefix,
            row.id,
            Outcome.error(RUNNER_LOST, FailureKind.INFRASTRUCTURE),
            policy=policy,
            from_statuses=(RunStatus.RUNNING,),
            require_lease_expired=True,  # a heartbeat that just arrived wins
        )
        ended += finished is not None
    return ended
