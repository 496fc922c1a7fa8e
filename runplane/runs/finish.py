"""Ending a run: the terminal status and everything that follows from it, in one transaction.

Whoever ends a run calls :func:`finish_run` (inside a transaction it opens, or nested in the
caller's) or :func:`end_run` (pool + bus: commits, then publishes pickups). Callers are the runner,
the scheduler loop's reaper, the dispatcher (launch failures, superseded merge runs) and the
Kubernetes launcher. What follows a terminal status:

- **success** resets the job's ``consecutive_failures``;
- **error** increments it; at the account's ``deactivate_after_failures`` (default
  :data:`DEFAULT_DEACTIVATE_AFTER_FAILURES`; 0: never) the job is deactivated with a reason and its
  ``version`` bumped, so the orchestrator stops its schedule;
- **completion triggers** whose statuses include the outcome queue their downstream job once
  (idempotency key ``done:{run_id}:{job_id}``), unless that job is deactivated, paused or deleted;
  an all-of job (fan-in, :mod:`runplane.runs.fan_in`) once every upstream job has such a run;
- **retries** (:mod:`runplane.runs.retries`): an error may queue a new run after a backoff.

The Kubernetes launcher ends a Pod killed for memory with::

    await end_run(pool, bus, prefix, run_id, Outcome.error(MEMORY_LIMIT_ERROR, FailureKind.STEP),
                  policy=RetryPolicy.from_settings(settings.runner))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from psycopg_pool import AsyncConnectionPool
from typing_extensions import Unpack

from runplane.adapters import instruments
from runplane.adapters.bus import Bus, Topology
from runplane.adapters.db import Connection, fetch_all, fetch_one
from runplane.basics.types import AccountId, JobId, Outcome, RunId, RunStatus
from runplane.runs.fan_in import QueuedRun, queue_fan_ins
from runplane.runs.pickups import hint_pickups
from runplane.runs.retries import EndedRun, FailedJob, RetryPolicy, queue_retry
from runplane.runs.transitions import TRANSITIONS

log = logging.getLogger(__name__)

Q = TRANSITIONS

DEFAULT_DEACTIVATE_AFTER_FAILURES = 100  # the column default of accounts.deactivate_after_failures
NON_TERMINAL = (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)


@dataclass(frozen=True)
class Finished:
    run_id: RunId
    account_id: AccountId
    job_id: JobId
    status: RunStatus
    retry_run_id: RunId | None = None
    downstream_run_ids: tuple[RunId, ...] = ()
    job_deactivated: bool = False
    retries_exhausted: bool = False
    pickup_accounts: frozenset[AccountId] = field(default_factory=frozenset)


class FinishGuards(TypedDict, total=False):
    """Which run a finish may end, passed through by :func:`end_run` to :func:`finish_run`."""

    from_statuses: Iterable[RunStatus]  # the statuses it may end from (default: any not terminal)
    lease_owner: str | None  # only while this runner holds its lease
    require_lease_expired: bool  # only once its lease has run out (the reaper)


async def finish_run(
    conn: Connection, run_id: int, outcome: Outcome, *, policy: RetryPolicy, **guards: Unpack[FinishGuards]
) -> Finished | None:
    """Move the run to ``outcome`` and apply its consequences; None when the compare-and-set lost.

    Opens a transaction on ``conn`` (a savepoint when the caller already has one open). Publish
    ``pickup_accounts`` after the commit (:func:`runplane.runs.pickups.hint_pickups`), as :func:`end_run` does.
    """
    if not outcome.status.is_terminal:
        raise ValueError(f"{outcome.status.name} is not a terminal status")
    async with conn.transaction():
        run = await fetch_one(
            conn,
            Q["finish_run"],
            {
                "run_id": run_id,
                "status": int(outcome.status),
                "message": outcome.message,
                "from_statuses": [int(s) for s in guards.get("from_statuses", NON_TERMINAL)],
                "lease_owner": guards.get("lease_owner"),
                "require_lease_expired": guards.get("require_lease_expired", False),
            },
            EndedRun,
        )
        if run is None:
            return None
        # Steps end with their run: one still running (its runner lost) ends as the run did, with the
        # reason; one never started is skipped. A runner that ended its steps itself leaves none.
        await conn.execute(
            Q["end_unfinished_steps"], {"run_id": run_id, "status": int(outcome.status), "reason": outcome.message}
        )
        job_id, account_id = run.job_id, run.account_id
        pickups = {account_id}  # a slot may have freed
        retry_run_id: RunId | None = None
        deactivated = exhausted = False
        if outcome.status is RunStatus.SUCCESS:
            await conn.execute(Q["reset_failures"], {"job_id": job_id})
        elif outcome.status is RunStatus.ERROR:
            job = await fetch_one(conn, Q["count_failure"], {"job_id": job_id, "run_id": run_id}, FailedJob)
            if job is not None:
                deactivated = bool(job.deactivated_now)
                retry_run_id, exhausted = await queue_retry(
                    conn, run, job, failure=outcome.failure, message=outcome.message, policy=policy
                )
                if retry_run_id is not None:
                    pickups.add(account_id)
        downstream: list[RunId] = []
        queued = await fetch_all(
            conn,
            Q["queue_completion_triggers"],
            {"run_id": run_id, "upstream_job_id": job_id, "status": int(outcome.status)},
            QueuedRun,
        )
        for row in queued:
            downstream.append(row.id)
            pickups.add(row.account_id)
        for fan_in in await queue_fan_ins(conn, run_id=run_id, upstream_job_id=job_id, status=outcome.status):
            downstream.append(fan_in.run_id)
            pickups.add(fan_in.account_id)
    if deactivated:
        instruments.deactivations.add(1)
    if retry_run_id is not None:
        instruments.retries.add(1, {"reason": str(outcome.failure)})
    log.info(
        "run finished",
        extra={
            "run_id": run_id,
            "job_id": job_id,
            "account_id": account_id,
            "status": outcome.status.name.lower(),
            "status_message": outcome.message,
            "retry_run_id": retry_run_id,
        },
    )
    return Finished(
        run_id=RunId(run_id),
        account_id=account_id,
        job_id=job_id,
        status=outcome.status,
        retry_run_id=retry_run_id,
        downstream_run_ids=tuple(downstream),
        job_deactivated=deactivated,
        retries_exhausted=exhausted,
        pickup_accounts=frozenset(pickups),
    )


async def end_run(
    pool: AsyncConnectionPool[Connection],
    bus: Bus | None,
    prefix: str,
    run_id: int,
    outcome: Outcome,
    *,
    policy: RetryPolicy,
    **guards: Unpack[FinishGuards],
) -> Finished | None:
    """:func:`finish_run` in its own transaction, then pickups for the accounts concerned."""
    async with pool.connection() as conn:
        finished = await finish_run(conn, run_id, outcome, policy=policy, **guards)
    if finished is not None:
        await hint_pickups(bus, Topology(prefix), finished.pickup_accounts, source="outcome")
    return finished
