"""Run-lifecycle metrics, made from the run rows by the scheduler loop.

Runs are queued by the API, the queuer workers and the outcome path, and started by runners that
live for one run and cannot be scraped; so one place records the delays of DESIGN.md from the
timestamps on the rows, once per run (the ``observed`` flags, claimed with SKIP LOCKED, make several
scheduler loops share the work without counting a run twice), and not while dispatch is far behind
(``SchedulerLoop.run_once``):

- queued: ``runplane.runs.queued`` and trigger lag (queued_at - scheduled_at; a retry scheduled in
  the future counts 0), when the run starts or ends, or after it has waited
  ``scheduler.observe_queued_after`` seconds, whichever comes first;
- started: ``runplane.runs.started``, wait time, prep time and run delay;
- finished: ``runplane.runs.finished`` by status, and run duration for runs that started.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from runplane.adapters import instruments
from runplane.adapters.db import Connection, fetch_all
from runplane.basics.types import RunStatus
from runplane.sql import load_queries

Q = load_queries("scheduler", "metrics.sql")

BATCH = 2000
QUEUED, STARTED, FINISHED = 1, 2, 4


@dataclass(frozen=True)
class ObservedRun:
    """A run whose events are being recorded, with the event flags recorded before (``before``)."""

    before: int
    status: int
    trigger: str
    job_type: str
    scheduled_at: datetime
    queued_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max(0.0, (later - earlier).total_seconds())


async def observe_runs(
    pool: AsyncConnectionPool[Connection], *, queued_after: float = 0.0, batch: int = BATCH, max_batches: int = 20
) -> int:
    """Record every run event not recorded yet; returns how many rows were read.

    The queue event of a run still queued waits until the run has been queued ``queued_after``
    seconds (``scheduler.observe_queued_after``): most runs start sooner and are then recorded
    queued and started in one write of their row."""
    seen = 0
    for _ in range(max_batches):
        async with pool.connection() as conn, conn.transaction():
            rows = await fetch_all(conn, Q["observe_runs"], {"limit": batch, "queued_after": queued_after}, ObservedRun)
        for row in rows:
            record(row)
        seen += len(rows)
        if len(rows) < batch:
            break
    return seen


def record(row: ObservedRun) -> None:
    before = row.before
    labels = {"trigger": row.trigger, "job_type": row.job_type}
    queued_at, scheduled_at = row.queued_at, row.scheduled_at
    dispatched_at, started_at, finished_at = row.dispatched_at, row.started_at, row.finished_at
    if not before & QUEUED:
        instruments.runs_queued.add(1, labels)
        instruments.trigger_lag.record(_seconds(queued_at, scheduled_at) or 0.0, labels)
    if not before & STARTED and isinstance(started_at, datetime):
        instruments.runs_started.add(1, labels)
        if isinstance(dispatched_at, datetime):
            instruments.wait_time.record(_seconds(dispatched_at, queued_at) or 0.0, labels)
            instruments.prep_time.record(_seconds(started_at, dispatched_at) or 0.0, labels)
        instruments.run_delay.record(_seconds(started_at, scheduled_at) or 0.0, labels)
    if not before & FINISHED and isinstance(finished_at, datetime):
        status = RunStatus(row.status).name.lower()
        instruments.runs_finished.add(1, {"status": status, **labels})
        if isinstance(started_at, datetime):
            instruments.run_duration.record(_seconds(finished_at, started_at) or 0.0, labels)
