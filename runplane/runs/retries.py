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

import psycopg.types.json

from runplane.adapters.db import Connection
from runplane.basics.backoff import jittered
from runplane.basics.settings import RunnerSettings
from runplane.basics.types import FailureKind, RunId, retry_idempotency_key
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


async def queue_retry(
    conn: Connection,
    run: dict[str, object],
    job: dict[str, object],
    *,
    failure: FailureKind | None,
    message: str,
    policy: RetryPolicy,
) -> tuple[RunId | None, bool]:
    """Queue the next attempt when the job's budget allows; else say whether the budget ran out."""
    budget = int(job["retry_max_attempts"])  # type: ignore[call-overload]
    retryable = failure is FailureKind.INFRASTRUCTURE or (
        failure is FailureKind.STEP and bool(job["retry_on_step_failure"])
    )
    if budget <= 0 or not retryable:
        return None, False
    attempt = int(run["attempt"])  # type: ignore[call-overload]
    # A paused job is queued by nothing automatic, its retries included.
    active = job["deactivated_at"] is None and job["deleted_at"] is None and job["paused_at"] is None
    if attempt > budget or not active:
        exhausted = f"{message}; retries exhausted after {attempt} attempts" if active else message
        if active:
            await conn.execute(Q["mark_retries_exhausted"], {"run_id": run["id"], "message": exhausted})
        return None, active
    cur = await conn.execute(
        Q["queue_retry"],
        {
            "account_id": run["account_id"],
            "job_id": run["job_id"],
            "job_type": run["job_type"],
            "cause": f"retry {attempt} of {budget} after run {run['id']}: {message}",
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
