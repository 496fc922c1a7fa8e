"""Retries: when a failed run gets another run, and after how long.

An error of kind :attr:`FailureKind.INFRASTRUCTURE` (runner lost, launch failure) is retried while
the job's ``retry_max_attempts`` allows; :attr:`FailureKind.STEP` (a failing step, a timeout, a
memory limit error) only when the job also sets ``retry_on_step_failure``. A retry is a new run
(trigger ``retry``, ``attempt + 1``, ``parent_run_id``) scheduled after :meth:`RetryPolicy.delay`:
the one backoff formula (:mod:`runplane.basics.backoff`), jittered. A run that fails with no budget
left is marked ``retries_exhausted`` and its message says so. :func:`queue_retry` runs inside the
transaction that ends the failed run (:func:`runplane.runs.finish.finish_run`).

Launching a run again (:mod:`runplane.runs.relaunch`) is not a retry: the same run goes back to
queued, after the backoff ceiling of its launch attempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg.types.json

from runplane.adapters.db import Connection, fetch_one
from runplane.basics.backoff import jittered
from runplane.basics.settings import RunnerSettings
from runplane.basics.types import AccountId, FailureKind, JobId, RunId, retry_idempotency_key
from runplane.runs.transitions import TRANSITIONS

Q = TRANSITIONS


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff of retries: ``base * 2**(attempt-1)`` capped at ``cap``, then half of it jittered."""

    backoff_base: float
    backoff_cap: float

    @classmethod
    def from_settings(cls, runner: RunnerSettings) -> RetryPolicy:
        return cls(runner.retry_backoff_base, runner.retry_backoff_cap)

    def delay(self, attempt: int) -> float:
        return jittered(self.backoff_base, attempt, cap=self.backoff_cap)


@dataclass(frozen=True)
class EndedRun:
    """The run a terminal status was just written to (``finish_run``), with what a retry copies from it."""

    id: RunId
    account_id: AccountId
    job_id: JobId
    job_type: str
    trigger: str
    cause: str
    attempt: int
    priority: int
    takes_slot: bool
    overrides: dict[str, object]
    pull_request_number: int | None
    schema_name: str


@dataclass(frozen=True)
class FailedJob:
    """A job after a failed run was counted (``count_failure``): whether it is still active, and its retries."""

    deactivated_now: bool | None
    deactivated_at: datetime | None
    deleted_at: datetime | None
    paused_at: datetime | None
    retry_max_attempts: int
    retry_on_step_failure: bool


@dataclass(frozen=True)
class _Queued:
    id: RunId


async def queue_retry(
    conn: Connection,
    run: EndedRun,
    job: FailedJob,
    *,
    failure: FailureKind | None,
    message: str,
    policy: RetryPolicy,
) -> tuple[RunId | None, bool]:
    """Queue the next attempt when the job's budget allows; else say whether the budget ran out."""
    budget = job.retry_max_attempts
    retryable = failure is FailureKind.INFRASTRUCTURE or (failure is FailureKind.STEP and job.retry_on_step_failure)
    if budget <= 0 or not retryable:
        return None, False
    attempt = run.attempt
    # A paused job is queued by nothing automatic, its retries included.
    active = job.deactivated_at is None and job.deleted_at is None and job.paused_at is None
    if attempt > budget or not active:
        exhausted = f"{message}; retries exhausted after {attempt} attempts" if active else message
        if active:
            await conn.execute(Q["mark_retries_exhausted"], {"run_id": run.id, "message": exhausted})
        return None, active
    row = await fetch_one(
        conn,
        Q["queue_retry"],
        {
            "account_id": run.account_id,
            "job_id": run.job_id,
            "job_type": run.job_type,
            "cause": f"retry {attempt} of {budget} after run {run.id}: {message}",
            "idempotency_key": retry_idempotency_key(run.id),
            "attempt": attempt + 1,
            "parent_run_id": run.id,
            "priority": run.priority,
            "takes_slot": run.takes_slot,
            "overrides": psycopg.types.json.Jsonb(run.overrides),
            "pull_request_number": run.pull_request_number,
            "schema_name": run.schema_name,
            "delay": policy.delay(attempt),
        },
        _Queued,
    )
    return (row.id if row else None), False
