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

from runplane.adapters.db import Connection, fetch_all, fetch_one
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


@dataclass(frozen=True)
class _AllOfJob:
    id: JobId


@dataclass(frozen=True)
class _Member:
    upstream_job_id: JobId
    run_id: int | None  # its newest counted run not in a set yet


@dataclass(frozen=True)
class QueuedRun:
    """A run an insert queued (``RETURNING id, account_id``)."""

    id: RunId
    account_id: AccountId


def fan_in_idempotency_key(job_id: int, upstream_run_ids: tuple[int, ...]) -> str:
    return f"fanin:{job_id}:" + ":".join(str(r) for r in upstream_run_ids)


async def queue_fan_ins(conn: Connection, *, run_id: int, upstream_job_id: int, status: RunStatus) -> list[FanIn]:
    """Queue the all-of jobs whose set this outcome completes; inside the caller's transaction."""
    params = {"upstream_job_id": upstream_job_id, "status": int(status)}
    jobs = await fetch_all(conn, Q["fan_in_jobs"], params, _AllOfJob)
    queued: list[FanIn] = []
    for job_id in (job.id for job in jobs):
        members = await fetch_all(conn, Q["fan_in_set"], {"job_id": job_id}, _Member)
        upstream_runs = tuple(m.run_id for m in members if m.run_id is not None)
        if not members or len(upstream_runs) < len(members):
            continue
        cause = "all upstream jobs finished: runs " + ", ".join(str(r) for r in upstream_runs)
        key = fan_in_idempotency_key(job_id, upstream_runs)
        row = await fetch_one(
            conn, Q["queue_fan_in"], {"job_id": job_id, "key": key, "run_id": run_id, "cause": cause}, QueuedRun
        )
        await conn.execute(
            Q["consume_fan_in"],
            {
                "job_id": job_id,
                "upstream_job_ids": [m.upstream_job_id for m in members],
                "run_ids": list(upstream_runs),
            },
        )
        if row is None:
            continue
        fan_in = FanIn(row.id, row.account_id, job_id, upstream_runs)
        log.info(
            "fan-in queued",
            extra={"job_id": job_id, "run_id": fan_in.run_id, "upstream_run_ids": list(upstream_runs)},
        )
        queued.append(fan_in)
    return queued
