"""The words of the design as types: ids, run statuses (dbt Cloud codes), job types, triggers."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

from runplane.v1 import common_pb2

AccountId = NewType("AccountId", int)
JobId = NewType("JobId", int)
RunId = NewType("RunId", int)
WorkerId = NewType("WorkerId", str)


class RunStatus(enum.IntEnum):
    """Run statuses; the values are the dbt Cloud API codes and the proto enum values."""

    QUEUED = 1
    STARTING = 2
    RUNNING = 3
    SUCCESS = 10
    ERROR = 20
    CANCELLED = 30

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.CANCELLED})


class JobType(enum.StrEnum):
    DEPLOY = "deploy"
    CI = "ci"
    MERGE = "merge"
    ADHOC = "adhoc"


class Trigger(enum.StrEnum):
    SCHEDULE = "schedule"
    API = "api"
    MANUAL = "manual"
    CI = "ci"
    MERGE = "merge"
    COMPLETION = "completion"
    RETRY = "retry"


class WaitingReason(enum.StrEnum):
    """Why a queued run has not been dispatched yet (shown on the run)."""

    NONE = ""
    NO_RUN_SLOT = "no_run_slot"
    JOB_ALREADY_RUNNING = "job_already_running"
    MERGE_IN_PROGRESS = "merge_in_progress"
    LAUNCH_BACKOFF = "launch_backoff"


# Proto enums number job types and triggers; the database stores their names.
JOB_TYPE_TO_PROTO: dict[JobType, common_pb2.JobType.ValueType] = {
    JobType.DEPLOY: common_pb2.JOB_TYPE_DEPLOY,
    JobType.CI: common_pb2.JOB_TYPE_CI,
    JobType.MERGE: common_pb2.JOB_TYPE_MERGE,
    JobType.ADHOC: common_pb2.JOB_TYPE_ADHOC,
}
JOB_TYPE_FROM_PROTO: dict[int, JobType] = {v: k for k, v in JOB_TYPE_TO_PROTO.items()}

TRIGGER_TO_PROTO: dict[Trigger, common_pb2.Trigger.ValueType] = {
    Trigger.SCHEDULE: common_pb2.TRIGGER_SCHEDULE,
    Trigger.API: common_pb2.TRIGGER_API,
    Trigger.MANUAL: common_pb2.TRIGGER_MANUAL,
    Trigger.CI: common_pb2.TRIGGER_CI,
    Trigger.MERGE: common_pb2.TRIGGER_MERGE,
    Trigger.COMPLETION: common_pb2.TRIGGER_COMPLETION,
    Trigger.RETRY: common_pb2.TRIGGER_RETRY,
}
TRIGGER_FROM_PROTO: dict[int, Trigger] = {v: k for k, v in TRIGGER_TO_PROTO.items()}


def takes_run_slot(job_type: JobType) -> bool:
    """CI runs take no run slot; every other run does."""
    return job_type is not JobType.CI


def schedule_idempotency_key(job_id: int, unix_ts: int) -> str:
    return f"sched:{job_id}:{unix_ts}"


def completion_idempotency_key(upstream_run_id: int, job_id: int) -> str:
    return f"done:{upstream_run_id}:{job_id}"


def retry_idempotency_key(parent_run_id: int) -> str:
    return f"retry:{parent_run_id}"


CI_SCHEMA_PREFIX = "dbt_cloud_pr_"


def ci_schema(job_id: int, pull_request_number: int | None, run_id: int | None = None) -> str:
    """The schema a CI run builds into: one per job and pull request (per run when there is none)."""
    if pull_request_number:
        return f"{CI_SCHEMA_PREFIX}{job_id}_{pull_request_number}"
    return f"{CI_SCHEMA_PREFIX}{job_id}_run_{run_id}"


# How a run ends. The rules that follow from an outcome live in ``runplane.runs``; these types
# are here so the runner can name an outcome without importing anything that reaches Postgres.
MEMORY_LIMIT_ERROR = "memory limit error"
DISK_QUOTA_ERROR = "disk quota exceeded"
RUNNER_LOST = "runner lost"


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
