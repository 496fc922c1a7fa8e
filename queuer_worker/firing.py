"""Queuing the runs of one tick: one multi-row INSERT, then a Pickup per account.

Runs are keyed ``sched:{job_id}:{unix_ts}`` and inserted ``ON CONFLICT DO NOTHING``, so a fire
queued twice (two owners during a failover, a redelivered message, a missed fire that was in fact
queued) is still one run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import SupportsInt, cast

from psycopg_pool import AsyncConnectionPool

from queuer_worker import metrics
from runplane.db import Connection
from runplane.runs.transitions import TRANSITIONS
from runplane.types import schedule_idempotency_key

log = logging.getLogger(__name__)


SUPERSEDED_MESSAGE = (
    "Cancelled: superseded by a newer scheduled run of this job that was queued while this one was still "
    "waiting. The job is over-scheduled: make it run faster or make its schedule less frequent."
)


@dataclass(frozen=True)
class TickResult:
    queued: int
    superseded: int
    accounts: frozenset[int]


@dataclass(frozen=True)
class PreparedTick:
    """The parameters of one tick's INSERT, built before the fire second.

    Arrays go over as Postgres array literals: building them is cheap in Python, sending one string
    is cheaper than adapting tens of thousands of values at the fire second.
    """

    due: list[tuple[int, int]]
    job_ids: str
    fire_ts: str
    keys: str


def prepare(due: list[tuple[int, int]]) -> PreparedTick:
    """Build the INSERT parameters of ``due`` [(job_id, fire_ts)]."""
    return PreparedTick(
        due,
        "{" + ",".join(str(job_id) for job_id, _ in due) + "}",
        "{" + ",".join(str(fire) for _, fire in due) + "}",
        # Keys are letters, digits and colons: nothing to quote in an array literal.
        "{" + ",".join(schedule_idempotency_key(job_id, fire) for job_id, fire in due) + "}",
    )


async def queue_runs(pool: AsyncConnectionPool[Connection], due: list[tuple[int, int]] | PreparedTick) -> TickResult:
    """Insert the runs of one tick in one statement, and cancel the runs they supersede, in one
    transaction."""
    tick = due if isinstance(due, PreparedTick) else prepare(due)
    if not tick.due:
        return TickResult(0, 0, frozenset())
    superseded = 0
    async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        await cur.execute(
            TRANSITIONS["queue_runs"], {"job_ids": tick.job_ids, "fire_ts": tick.fire_ts, "keys": tick.keys}
        )
        rows = await cur.fetchall()
        if rows:
            await cur.execute("SET LOCAL enable_nestloop = off")
            await cur.execute(
                TRANSITIONS["cancel_superseded"],
                {
                    "job_ids": [row["job_id"] for row in rows],
                    "fire_ts": [row["fire_ts"] for row in rows],
                    "message": SUPERSEDED_MESSAGE,
                },
            )
            superseded = cur.rowcount
    if superseded:
        metrics.runs_superseded(superseded)
    return TickResult(len(rows), superseded, frozenset(int(cast(SupportsInt, row["account_id"])) for row in rows))
