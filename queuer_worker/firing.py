"""Queuing the runs of one tick: multi-row INSERTs of up to ``queuer.insert_chunk`` runs, each
committed on its own and followed by the Pickups of its accounts.

Runs are keyed ``sched:{job_id}:{unix_ts}`` and inserted ``ON CONFLICT DO NOTHING``, so a fire
queued twice (two owners during a failover, a redelivered message, a missed fire that was in fact
queued) is still one run.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from psycopg_pool import AsyncConnectionPool

from queuer_worker import metrics
from queuer_worker.heap import Due, MissedFire
from runplane.adapters import instruments
from runplane.adapters.db import Connection, fetch_all, fetch_value, fetch_values
from runplane.basics.overlap import OVERLAP_REPLACED, SKIPPED_DETAILS, SkipReason
from runplane.basics.types import schedule_idempotency_key
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("queuer_worker")


# Why a superseded cron run was still waiting (see ``cancel_superseded``), and what it tells the user.
_SUPERSEDED = "Cancelled: superseded by a newer scheduled run of this job, queued while this one was still waiting"
SUPERSEDED_MESSAGES = {
    "job_running": (
        f"{_SUPERSEDED} for the job's previous run to finish. The job is over-scheduled: make it run faster "
        "or make its schedule less frequent."
    ),
    "no_slot": (
        f"{_SUPERSEDED} for a free run slot: every run slot of the account was in use. Add run slots or "
        "spread the account's schedules."
    ),
    "behind": f"{_SUPERSEDED} to be dispatched: runplane was behind. Nothing needs to change on your side.",
}
# A run dispatched less than this ago counts as taking its slot; an older start that never got a
# runner is the system's delay, not the account's.
FRESH_START_SECONDS = 30


@dataclass(frozen=True)
class TickResult:
    queued: int
    superseded: int
    accounts: frozenset[int]
    superseded_by_reason: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # occurrences recorded as skipped by their job's overlap policy
    replaced: int = 0  # runs in progress cancelled by a new run of a cancel_other job


@dataclass(frozen=True, slots=True)
class _Decided:
    """An occurrence ``queue_runs`` decided: a run it inserted, or a skipped occurrence it recorded (a
    fire decided before, or a job no longer schedulable, is neither)."""

    run_id: int | None
    account_id: int
    job_id: int
    fire_ts: int
    trigger_lag: float
    overlap_policy: str
    skipped: bool


@dataclass(frozen=True)
class PreparedTick:
    """The parameters of one tick's INSERT, built before the fire second.

    Arrays go over as Postgres array literals: building them is cheap in Python, sending one string
    is cheaper than adapting tens of thousands of values at the fire second.
    """

    due: list[Due]
    job_ids: str
    fire_ts: str
    keys: str
    crons: str
    timezones: str
    offsets: str = "{}"  # each fire's jitter offset: its run is due this many seconds after fire_ts


def _text_array(values: Iterable[str]) -> str:
    """A Postgres array literal of ``values``, each quoted (a cron holds spaces and commas)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def prepare(due: list[Due]) -> PreparedTick:
    """Build the INSERT parameters of ``due``."""
    return PreparedTick(
        due,
        "{" + ",".join(str(d.job_id) for d in due) + "}",
        "{" + ",".join(str(d.fire_ts) for d in due) + "}",
        # Keys are letters, digits and colons: nothing to quote in an array literal.
        "{" + ",".join(schedule_idempotency_key(d.job_id, d.fire_ts) for d in due) + "}",
        _text_array(d.cron for d in due),
        _text_array(d.timezone for d in due),
        "{" + ",".join(str(d.offset) for d in due) + "}",
    )


def prepare_chunks(due: list[Due], size: int) -> list[PreparedTick]:
    """``due`` in ticks of at most ``size`` runs: each is queued and committed on its own, so the
    first runs of a large tick reach the dispatchers while the rest are still being inserted."""
    return [prepare(due[start : start + size]) for start in range(0, len(due), size)]


async def queue_runs(pool: AsyncConnectionPool[Connection], due: list[Due] | PreparedTick) -> TickResult:
    """Insert the runs of one tick in one statement, and cancel the runs they supersede, in one
    transaction."""
    tick = due if isinstance(due, PreparedTick) else prepare(due)
    if not tick.due:
        return TickResult(0, 0, frozenset())
    by_reason: Counter[str] = Counter()
    replaced = 0
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(TRANSITIONS["lock_overlap_jobs"], {"job_ids": tick.job_ids})
        params = {
            "job_ids": tick.job_ids,
            "fire_ts": tick.fire_ts,
            "keys": tick.keys,
            "crons": tick.crons,
            "timezones": tick.timezones,
            "offsets": tick.offsets,
            **SKIPPED_DETAILS,
        }
        decided = await fetch_all(conn, TRANSITIONS["queue_runs"], params, _Decided)
        rows = [row for row in decided if not row.skipped]
        if rows:
            await conn.execute("SET LOCAL enable_nestloop = off")
            superseded = {
                "job_ids": [row.job_id for row in rows],
                "fire_ts": [row.fire_ts for row in rows],
                "fresh_start": FRESH_START_SECONDS,
                **SUPERSEDED_MESSAGES,
            }
            by_reason.update(await fetch_values(conn, TRANSITIONS["cancel_superseded"], superseded, str))
            replaced = await _cancel_overlapped(conn, [row for row in rows if row.overlap_policy == "cancel_other"])
    for reason, count in by_reason.items():
        metrics.runs_superseded(reason, count)
    skipped = [row for row in decided if row.skipped]
    for row in skipped:
        instruments.occurrences_skipped.add(1, {"reason": SkipReason.OVERLAP.value})
        log.info(
            "occurrence skipped", extra={"job_id": row.job_id, "account_id": row.account_id, "fire_ts": row.fire_ts}
        )
    if replaced:
        instruments.cancellations.add(replaced, {"reason": "overlap_replaced"})
    accounts = frozenset(row.account_id for row in rows)
    return TickResult(len(rows), by_reason.total(), accounts, dict(by_reason), len(skipped), replaced)


async def _cancel_overlapped(conn: Connection, rows: list[_Decided]) -> int:
    """The runs in progress of the cancel_other jobs just queued, cancelled (or asked to stop) by the
    new run of each; how many."""
    if not rows:
        return 0
    params = {
        "job_ids": [row.job_id for row in rows],
        "run_ids": [row.run_id for row in rows],
        "message": OVERLAP_REPLACED,
    }
    async with conn.cursor() as cur:
        await cur.execute(TRANSITIONS["cancel_overlapped"], params)
        return cur.rowcount


async def record_missed(pool: AsyncConnectionPool[Connection], missed: list[MissedFire]) -> int:
    """Record the fires a new owner gives up as skipped occurrences (reason ``missed``), those with no
    run and of the schedule in force; how many were recorded."""
    if not missed:
        return 0
    params = {
        "job_ids": [m.job_id for m in missed],
        "fire_ts": [m.fire_ts for m in missed],
        "keys": [schedule_idempotency_key(m.job_id, m.fire_ts) for m in missed],
        "crons": [m.cron for m in missed],
        "timezones": [m.timezone for m in missed],
        "details": [m.detail for m in missed],
    }
    async with pool.connection() as conn:
        recorded = await fetch_values(conn, QUERIES["record_missed"], params, int)
    if recorded:
        instruments.occurrences_skipped.add(len(recorded), {"reason": SkipReason.MISSED.value})
        log.warning("missed occurrences skipped", extra={"job_ids": sorted(set(recorded)), "count": len(recorded)})
    return len(recorded)


async def worker_state(pool: AsyncConnectionPool[Connection], worker_id: str) -> str | None:
    """The worker's state as the leader recorded it ('alive', 'dead'); None before its first beat."""
    async with pool.connection() as conn:
        return await fetch_value(conn, QUERIES["worker_state"], {"worker_id": worker_id}, str)


def never_fires_reason(cron: str, timezone: str) -> str:
    """What GetJob shows for a job deactivated because its schedule has no next fire."""
    return f"deactivated: the schedule {cron[:200]!r} ({timezone[:64]}) never fires; fix the schedule and save the job"


async def deactivate_never_fires(
    pool: AsyncConnectionPool[Connection], job_id: int, version: int, cron: str, timezone: str
) -> bool:
    """Record that a job's schedule never fires, as that job's error; True when this call did it."""
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(
            QUERIES["deactivate_never_fires"],
            {"job_id": job_id, "version": version, "reason": never_fires_reason(cron, timezone)},
        )
        done = cur.rowcount == 1
    if done:
        instruments.deactivations.add(1, {"reason": "never_fires"})
    log.warning("schedule never fires; job deactivated", extra={"job_id": job_id, "cron": cron[:200]})
    return done
