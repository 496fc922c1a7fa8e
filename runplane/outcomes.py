"""Ending a run: the terminal status and everything that follows from it, in one transaction.

Whoever ends a run calls :func:`finish_run` (inside a transaction it opens, or nested in the
caller's) or :func:`end_run` (pool + bus: commits, then publishes pickups). Callers are the runner,
the scheduler loop's reaper, the dispatcher (launch failures, superseded merge runs) and the
Kubernetes launcher. What follows a terminal status:

- **success** resets the job's ``consecutive_failures``;
- **error** increments it; at :data:`DEACTIVATE_AFTER_FAILURES` the job is deactivated with a reason
  and its ``version`` bumped, so the orchestrator stops its schedule;
- **completion triggers** whose statuses include the outcome queue their downstream job once
  (idempotency key ``done:{run_id}:{job_id}``), unless that job is deactivated or deleted;
- **retries**: an error of kind :attr:`FailureKind.INFRASTRUCTURE` (runner lost, launch failure) is
  retried while the job's ``retry_max_attempts`` allows; :attr:`FailureKind.STEP` (a failing step,
  a timeout, a memory limit error) only when the job also sets ``retry_on_step_failure``. A retry is
  a new run (trigger ``retry``, ``attempt + 1``, ``parent_run_id``) scheduled after an exponential
  backoff with jitter, capped. A run that fails with no budget left is marked
  ``retries_exhausted`` and its message says so.

The Kubernetes launcher ends a Pod killed for memory with::

    await end_run(pool, bus, prefix, run_id, Outcome.error(MEMORY_LIMIT_ERROR, FailureKind.STEP),
                  policy=RetryPolicy.from_settings(settings.runner))
"""

from __future__ import annotations

import enum
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg.types.json
from psycopg_pool import AsyncConnectionPool

from runplane import instruments
from runplane.bus import Bus, Topology
from runplane.db import Connection
from runplane.errors import ServiceUnavailable
from runplane.settings import RunnerSettings
from runplane.sql import load_queries
from runplane.types import AccountId, JobId, RunId, RunStatus, retry_idempotency_key
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

Q = load_queries("runplane.sql", "outcomes.sql")

DEACTIVATE_AFTER_FAILURES = 100
MEMORY_LIMIT_ERROR = "memory limit error"
RUNNER_LOST = "runner lost"
NON_TERMINAL = (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)


class FailureKind(enum.StrEnum):
    STEP = "step"  # the work itself failed: retried only when the job says so
    INFRASTRUCTURE = "infrastructure"  # runner lost, launch failure: retried while budget remains


@dataclass(frozen=True)
class Outcome:
    status: RunStatus
    message: str = ""
    failure: FailureKind | None = None

    @classmethod
    def success(cls) -> Outcome:
        return cls(RunStatus.SUCCESS)

    @classmethod
    def error(cls, message: str, failure: FailureKind) -> Outcome:
        return cls(RunStatus.ERROR, message, failure)

    @classmethod
    def cancelled(cls, message: str = "cancelled") -> Outcome:
        return cls(RunStatus.CANCELLED, message)


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff of retries: ``base * 2**(attempt-1)`` capped at ``cap``, then half of it jittered."""

    backoff_base: float
    backoff_cap: float

    @classmethod
    def from_settings(cls, runner: RunnerSettings) -> RetryPolicy:
        return cls(runner.retry_backoff_base, runner.retry_backoff_cap)

    def delay(self, attempt: int) -> float:
        ceiling = min(self.backoff_cap, self.backoff_base * 2 ** max(0, attempt - 1))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))


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


async def finish_run(
    conn: Connection,
    run_id: int,
    outcome: Outcome,
    *,
    policy: RetryPolicy,
    from_statuses: Iterable[RunStatus] = NON_TERMINAL,
    lease_owner: str | None = None,
    require_lease_expired: bool = False,
) -> Finished | None:
    """Move the run to ``outcome`` and apply its consequences; None when the compare-and-set lost.

    Opens a transaction on ``conn`` (a savepoint when the caller already has one open). Publish
    ``pickup_accounts`` after the commit (:func:`publish_pickups`), as :func:`end_run` does.
    """
    if not outcome.status.is_terminal:
        raise ValueError(f"{outcome.status.name} is not a terminal status")
    async with conn.transaction():
        cur = await conn.execute(
            Q["finish_run"],
            {
                "run_id": run_id,
                "status": int(outcome.status),
                "message": outcome.message,
                "from_statuses": [int(s) for s in from_statuses],
                "lease_owner": lease_owner,
                "require_lease_expired": require_lease_expired,
            },
        )
        run = await cur.fetchone()
        if run is None:
            return None
        # Steps end with their run: one still running (its runner lost) ends as the run did, with the
        # reason; one never started is skipped. A runner that ended its steps itself leaves none.
        await conn.execute(
            Q["end_unfinished_steps"], {"run_id": run_id, "status": int(outcome.status), "reason": outcome.message}
        )
        job_id = JobId(int(run["job_id"]))  # type: ignore[call-overload]
        account_id = AccountId(int(run["account_id"]))  # type: ignore[call-overload]
        pickups = {account_id}  # a slot may have freed
        retry_run_id: RunId | None = None
        deactivated = exhausted = False
        if outcome.status is RunStatus.SUCCESS:
            await conn.execute(Q["reset_failures"], {"job_id": job_id})
        elif outcome.status is RunStatus.ERROR:
            reason = f"deactivated after {DEACTIVATE_AFTER_FAILURES} consecutive failed runs (last: run {run_id})"
            cur = await conn.execute(
                Q["count_failure"], {"job_id": job_id, "limit": DEACTIVATE_AFTER_FAILURES, "reason": reason}
            )
            job = await cur.fetchone()
            if job is not None:
                deactivated = bool(job["deactivated_now"])
                retry_run_id, exhausted = await _retry(conn, run, job, outcome, policy)
                if retry_run_id is not None:
                    pickups.add(account_id)
        downstream: list[RunId] = []
        cur = await conn.execute(
            Q["queue_completion_triggers"],
            {"run_id": run_id, "upstream_job_id": job_id, "status": int(outcome.status)},
        )
        for row in await cur.fetchall():
            downstream.append(RunId(int(row["id"])))  # type: ignore[call-overload]
            pickups.add(AccountId(int(row["account_id"])))  # type: ignore[call-overload]
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


async def _retry(
    conn: Connection, run: dict[str, object], job: dict[str, object], outcome: Outcome, policy: RetryPolicy
) -> tuple[RunId | None, bool]:
    """Queue the next attempt when the job's budget allows; else say whether the budget ran out."""
    budget = int(job["retry_max_attempts"])  # type: ignore[call-overload]
    retryable = outcome.failure is FailureKind.INFRASTRUCTURE or (
        outcome.failure is FailureKind.STEP and bool(job["retry_on_step_failure"])
    )
    if budget <= 0 or not retryable:
        return None, False
    attempt = int(run["attempt"])  # type: ignore[call-overload]
    active = job["deactivated_at"] is None and job["deleted_at"] is None
    if attempt > budget or not active:
        message = f"{outcome.message}; retries exhausted after {attempt} attempts" if active else outcome.message
        if active:
            await conn.execute(Q["mark_retries_exhausted"], {"run_id": run["id"], "message": message})
        return None, active
    cur = await conn.execute(
        Q["queue_retry"],
        {
            "account_id": run["account_id"],
            "job_id": run["job_id"],
            "job_type": run["job_type"],
            "cause": f"retry {attempt} of {budget} after run {run['id']}: {outcome.message}",
            "idempotency_key": retry_idempotency_key(int(run["id"])),  # type: ignore[call-overload]
            "attempt": attempt + 1,
            "parent_run_id": run["id"],
            "priority": run["priority"],
            "takes_slot": run["takes_slot"],
            "overrides": psycopg.types.json.Jsonb(run["overrides"]),
            "pull_request_number": run["pull_request_number"],
            "schema_name": run["schema_name"],
            "delay": policy.delay(attempt),
        },
    )
    row = await cur.fetchone()
    return (RunId(int(row["id"])) if row else None), False  # type: ignore[call-overload]


async def publish_pickups(bus: Bus | None, prefix: str, account_ids: Iterable[int]) -> None:
    """Tell dispatchers these accounts may have work; best effort (the scheduler loop resends)."""
    if bus is None:
        return
    queue = Topology(prefix).pickup
    sent_at_ms = int(time.time() * 1000)
    for account_id in sorted(set(account_ids)):
        try:
            await bus.publish(queue, bus_pb2.Pickup(account_id=account_id, sent_at_ms=sent_at_ms))
        except ServiceUnavailable as exc:
            log.warning("pickup not published", extra={"account_id": account_id, "error": str(exc)})
            return
        instruments.pickups_published.add(1, {"source": "outcome"})


async def end_run(
    pool: AsyncConnectionPool[Connection],
    bus: Bus | None,
    prefix: str,
    run_id: int,
    outcome: Outcome,
    *,
    policy: RetryPolicy,
    from_statuses: Iterable[RunStatus] = NON_TERMINAL,
    lease_owner: str | None = None,
    require_lease_expired: bool = False,
) -> Finished | None:
    """:func:`finish_run` in its own transaction, then pickups for the accounts concerned."""
    async with pool.connection() as conn:
        finished = await finish_run(
            conn,
            run_id,
            outcome,
            policy=policy,
            from_statuses=from_statuses,
            lease_owner=lease_owner,
            require_lease_expired=require_lease_expired,
        )
    if finished is not None:
        await publish_pickups(bus, prefix, finished.pickup_accounts)
    return finished
