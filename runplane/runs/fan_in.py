"""Fan-in: a job whose completion triggers combine as "all" runs once every upstream job has finished
with a counted status since its last such run.

Called by :func:`runplane.runs.finish.finish_run` in the transaction that ends an upstream run. Each
set is queued once: the downstream job's row is locked first (``FOR UPDATE``), so two upstream runs
ending at once on two runners or dispatchers check one after the other, and the second sees the
first's committed outcome (each statement reads what was committed before it began). The run's
idempotency key names the set, ``fanin:{job_id}:{upstream run ids}`` in upstream job order, so a
repeated finish queues nothing twice; the upstream runs of a set are then counted
(``completion_consumed``) and only later ones make the next set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runplane.adapters.db import Connection
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from runplane.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("runplane.runs", "fan_in.sql")


@dataclass(frozen=True)
class FanIn:
    run_id: RunId
    account_id: AccountId
    job_id: JobId
    upstream_run_ids: tuple[int, ...]


def fan_in_idempotency_key(job_id: int, upstream_run_ids: tuple[int, ...]) -> str:
    return f"fanin:{job_id}:" + ":".join(str(r) for r in upstream_run_ids)


async def queue_fan_ins(conn: Connection, *, run_id: int, upstream_job_id: int, status: RunStatus) -> list[FanIn]:
    """Queue the all-of jobs whose set this outcome completes; inside the caller's transaction."""
    cur = await conn.execute(Q["fan_in_jobs"], {"upstream_job_id": upstream_job_id, "status": int(status)})
    job_ids = [int(row["id"]) for row in await cur.fetchall()]  # type: ignore[call-overload]
    queued: list[FanIn] = []
    for job_id in job_ids:
        cur = await conn.execute(Q["fan_in_set"], {"job_id": job_id})
        members = [(int(r["upstream_job_id"]), r["run_id"]) for r in await cur.fetchall()]  # type: ignore[call-overload]
        if not members or any(member is None for _, member in members):
            continue
        upstream_runs = tuple(int(member) for _, member in members)  # type: ignore[call-overload]
        cur = await conn.execute(
            Q["queue_fan_in"],
            {
                "job_id": job_id,
                "key": fan_in_idempotency_key(job_id, upstream_runs),
                "run_id": run_id,
                "cause": "all upstream jobs finished: runs " + ", ".join(str(r) for r in upstream_runs),
            },
        )
        row = await cur.fetchone()
        await conn.execute(
            Q["consume_fan_in"],
            {"job_id": job_id, "upstream_job_ids": [u for u, _ in members], "run_ids": list(upstream_runs)},
        )
        if row is None:
            continue
        fan_in = FanIn(
            RunId(int(row["id"])),  # type: ignore[call-overload]
            AccountId(int(row["account_id"])),  # type: ignore[call-overload]
            JobId(job_id),
            upstream_runs,
        )
        log.info(
            "fan-in queued",
            extra={"job_id": job_id, "run_id": fan_in.run_id, "upstream_run_ids": list(upstream_runs)},
        )
        queued.append(fan_in)
    return queued
