"""Deciding which queued runs of an account start now: run slots, serial execution, CI and merge rules.

Pure: the dispatcher reads the account's starting/running runs and its due queued runs (in order:
priority, then queue time) inside the transaction that locks the account row, and applies the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from runplane.basics.types import JobId, JobType, RunId, WaitingReason, ci_schema


@dataclass(frozen=True)
class ActiveRun:
    """A run that is starting or running."""

    job_id: JobId
    takes_slot: bool


@dataclass(frozen=True)
class QueuedRun:
    run_id: RunId
    job_id: JobId
    job_type: JobType
    takes_slot: bool
    queued_at: datetime
    pull_request_number: int | None = None
    schema_name: str = ""
    concurrent: bool = False  # its job's overlap policy is allow_all: no serial execution


@dataclass
class DispatchPlan:
    start: list[QueuedRun] = field(default_factory=list)
    schemas: dict[RunId, str] = field(default_factory=dict)  # the schema each started run writes to
    waiting: dict[RunId, WaitingReason] = field(default_factory=dict)
    superseded: list[QueuedRun] = field(default_factory=list)  # older queued merge runs: cancelled


def plan_dispatch(run_slots: int, active: list[ActiveRun], queued: list[QueuedRun]) -> DispatchPlan:
    """Walk ``queued`` in order and decide each run.

    - CI runs take no slot and run concurrently, each in its own schema.
    - Merge runs take a slot, one in progress per job; of several queued, only the newest may start
      and the older ones are superseded.
    - Every other run (deploy, API, manual, adhoc) needs a free slot and no other starting or
      running run of its job, unless its job's overlap policy is allow_all (``concurrent``).
    """
    plan = DispatchPlan()
    occupied = sum(1 for run in active if run.takes_slot)
    busy_jobs = {run.job_id for run in active}
    newest_merge: dict[JobId, QueuedRun] = {}
    for run in queued:
        if run.job_type is JobType.MERGE:
            newest = newest_merge.get(run.job_id)
            if newest is None or (run.queued_at, run.run_id) > (newest.queued_at, newest.run_id):
                newest_merge[run.job_id] = run
    for run in queued:
        if run.job_type is JobType.CI:
            plan.start.append(run)
            plan.schemas[run.run_id] = run.schema_name or ci_schema(run.job_id, run.pull_request_number, run.run_id)
            continue
        if run.job_type is JobType.MERGE and newest_merge[run.job_id] is not run:
            plan.superseded.append(run)
            continue
        if run.job_id in busy_jobs and not run.concurrent:
            reason = (
                WaitingReason.MERGE_IN_PROGRESS if run.job_type is JobType.MERGE else WaitingReason.JOB_ALREADY_RUNNING
            )
            plan.waiting[run.run_id] = reason
            continue
        if run.takes_slot and occupied >= run_slots:
            plan.waiting[run.run_id] = WaitingReason.NO_RUN_SLOT
            continue
        plan.start.append(run)
        plan.schemas[run.run_id] = run.schema_name
        occupied += int(run.takes_slot)
        busy_jobs.add(run.job_id)
    return plan
