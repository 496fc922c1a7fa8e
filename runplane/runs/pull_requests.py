"""A pull request's CI runs and its schema: the one home of the CI lifecycle.

- A new CI run of a pull request supersedes that pull request's older CI runs of the same job
  (:func:`supersede_older_ci_runs`): queued ones are cancelled, starting or running ones are asked
  to stop, each with a message naming the commit (or event) that superseded it.
- Every CI run of a job with an environment records the schema it builds in
  (:func:`record_pull_request_schema`).
- Closing the pull request (the API, or a Git webhook) and the periodic sweep of schemas older than
  the account's ``pull_request_schema_max_age_days`` queue a *schema drop run*
  (:func:`queue_schema_drop`): a CI run of the same job whose one step is
  ``dbt run-operation runplane_drop_pull_request_schema``. The warehouse is touched only by runs,
  with the environment's connection, inside the runner, as every other run: the control plane holds
  no warehouse session. The runner adds the macro to the checkout for such a run
  (``runner/macros.py``); the macro refuses any schema that is not a pull request's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.bus import Bus, Topology
from runplane.adapters.db import Connection, fetch_all, fetch_one
from runplane.basics.types import AccountId, JobId, RunId
from runplane.dbt.context import DROP_SCHEMA_MACRO
from runplane.runs.pickups import hint_pickups
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("runplane.runs", "pull_requests.sql")

DROP_SCHEMA_STEP = f"dbt run-operation {DROP_SCHEMA_MACRO}"
SWEEP_BATCH = 100


@dataclass(frozen=True)
class SchemaDrop:
    run_id: RunId
    account_id: AccountId
    job_id: JobId
    pull_request_number: int
    schema: str


@dataclass(frozen=True)
class _Superseded:
    id: RunId
    status: int


@dataclass(frozen=True)
class _QueuedDrop:
    id: RunId
    account_id: AccountId
    job_id: JobId
    pull_request_number: int
    schema_name: str


@dataclass(frozen=True)
class _SchemaOfJob:
    job_id: JobId


@dataclass(frozen=True)
class _SchemaOfPullRequest:
    job_id: JobId
    pull_request_number: int


def superseded_message(run_id: int, pull_request_number: int, git_sha: str) -> str:
    """What an older CI run says when a newer one of its pull request replaced it."""
    commit = f"commit {git_sha[:12]}" if git_sha else "a newer trigger"
    return f"Cancelled: superseded by run {run_id} of pull request #{pull_request_number} at {commit}"


async def supersede_older_ci_runs(
    conn: Connection, *, job_id: int, pull_request_number: int, run_id: int, message: str
) -> list[RunId]:
    """Cancel (queued) or stop (starting, running) the job's older CI runs of the pull request."""
    params = {"job_id": job_id, "pull_request_number": pull_request_number, "run_id": run_id, "message": message}
    superseded = [row.id for row in await fetch_all(conn, TRANSITIONS["supersede_ci_runs"], params, _Superseded)]
    if superseded:
        log.info(
            "older ci runs superseded",
            extra={"job_id": job_id, "run_id": run_id, "pull_request": pull_request_number, "superseded": superseded},
        )
    return superseded


async def record_pull_request_schema(
    conn: Connection, *, account_id: int, job_id: int, pull_request_number: int, schema: str, run_id: int
) -> None:
    await conn.execute(
        Q["record_pull_request_schema"],
        {
            "account_id": account_id,
            "job_id": job_id,
            "pull_request_number": pull_request_number,
            "schema_name": schema,
            "run_id": run_id,
        },
    )


async def queue_schema_drop(conn: Connection, *, job_id: int, pull_request_number: int, why: str) -> SchemaDrop | None:
    """Queue the run that drops the pull request's schema of ``job_id``, and stop its other CI runs.

    None when there is nothing to drop: the job never built one for the pull request, or a drop is
    queued already (or failed within the hour).
    """
    async with conn.transaction():
        params = {"job_id": job_id, "pull_request_number": pull_request_number, "cause": why, "step": DROP_SCHEMA_STEP}
        row = await fetch_one(conn, Q["queue_schema_drop"], params, _QueuedDrop)
        if row is None:
            return None
        drop = SchemaDrop(row.id, row.account_id, row.job_id, row.pull_request_number, row.schema_name)
        # A CI run still building would recreate the schema after the drop.
        await supersede_older_ci_runs(
            conn,
            job_id=job_id,
            pull_request_number=pull_request_number,
            run_id=drop.run_id,
            message=f"Cancelled: {why}; run {drop.run_id} drops schema {drop.schema}",
        )
    log.info(
        "pull request schema drop queued",
        extra={"account_id": drop.account_id, "job_id": job_id, "run_id": drop.run_id, "schema": drop.schema},
    )
    return drop


async def schema_jobs_of_pull_request(
    conn: Connection, account_id: int, pull_request_number: int, job_ids: list[int]
) -> list[JobId]:
    """The jobs that built a schema for the pull request (among ``job_ids``; empty: any)."""
    params = {"account_id": account_id, "pull_request_number": pull_request_number, "job_ids": job_ids}
    return [row.job_id for row in await fetch_all(conn, Q["schemas_of_pull_request"], params, _SchemaOfJob)]


async def sweep_pull_request_schemas(
    pool: AsyncConnectionPool[Connection], bus: Bus | None, prefix: str, *, limit: int = SWEEP_BATCH
) -> list[SchemaDrop]:
    """Queue drops of the schemas older than their account keeps them, at most ``limit`` per call."""
    async with pool.connection() as conn:
        stale = await fetch_all(conn, Q["stale_pull_request_schemas"], {"limit": limit}, _SchemaOfPullRequest)
        drops = []
        for job_id, number in ((s.job_id, s.pull_request_number) for s in stale):
            why = f"the schema of pull request #{number} had no CI run for longer than the account keeps it"
            drop = await queue_schema_drop(conn, job_id=job_id, pull_request_number=number, why=why)
            if drop is not None:
                drops.append(drop)
    await hint_pickups(bus, Topology(prefix), {d.account_id for d in drops}, source="pull_request_sweep")
    return drops
