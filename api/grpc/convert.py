"""Database rows to protobuf messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from api.projects_validation import CREDENTIAL_KINDS, ENVIRONMENT_TYPES
from api.rows import (
    Artifact,
    CompletionTrigger,
    Environment,
    Job,
    LogChunk,
    Project,
    Run,
    RunStep,
    SkippedOccurrence,
)
from runplane.basics.overlap import OVERLAP_TO_PROTO, OverlapPolicy
from runplane.basics.types import JOB_TYPE_TO_PROTO, TRIGGER_TO_PROTO, JobType, RunStatus, Trigger
from runplane.v1 import common_pb2, jobs_pb2, projects_pb2, runs_pb2


def timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


COMPLETION_MODES = {"any": jobs_pb2.COMPLETION_MODE_ANY, "all": jobs_pb2.COMPLETION_MODE_ALL}
GIT_CREDENTIAL_KINDS = {name: kind for kind, name in CREDENTIAL_KINDS.items()}
ENVIRONMENT_TYPES_BY_NAME = {name: kind for kind, name in ENVIRONMENT_TYPES.items()}


def job(row: Job, completion_triggers: list[CompletionTrigger]) -> jobs_pb2.Job:
    triggers = jobs_pb2.JobTriggers(
        on_completion=[
            jobs_pb2.CompletionTrigger(
                upstream_job_id=t.upstream_job_id, statuses=[common_pb2.RunStatus.ValueType(s) for s in t.statuses]
            )
            for t in completion_triggers
        ],
        on_pull_request=row.on_pull_request,
        on_merge=row.on_merge,
        completion_mode=COMPLETION_MODES[row.completion_mode],
    )
    if row.cron is not None:
        triggers.schedule.CopyFrom(jobs_pb2.CronSchedule(cron=row.cron, timezone=row.timezone))
    return jobs_pb2.Job(
        id=row.id,
        account_id=row.account_id,
        name=row.name,
        job_type=JOB_TYPE_TO_PROTO[JobType(row.job_type)],
        steps=row.steps,
        triggers=triggers,
        settings=jobs_pb2.JobSettings(
            threads=row.threads,
            timeout_seconds=row.timeout_seconds,
            target_name=row.target_name,
            environment=row.environment,
            git_branch=row.git_branch,
            retry_max_attempts=row.retry_max_attempts,
            retry_on_step_failure=row.retry_on_step_failure,
            missed_run_grace_seconds=row.missed_run_grace_seconds,
            priority=row.priority,
            secret_names=sorted(row.secret_environment),
            environment_id=row.environment_id or 0,
            schema=row.schema_name,
            generate_docs=row.generate_docs,
            run_source_freshness=row.run_source_freshness,
            defer_to_job_id=row.defer_to_job_id or 0,
            defer_to_environment_id=row.defer_to_environment_id or 0,
            run_only_modified=row.run_only_modified,
            overlap_policy=OVERLAP_TO_PROTO[OverlapPolicy(row.overlap_policy)],
            jitter_seconds=row.jitter_seconds,
            catchup_window_seconds=row.catchup_window_seconds,
            catchup_all=row.catchup_all,
        ),
        active=row.deactivated_at is None,
        deactivation_reason=row.deactivation_reason,
        consecutive_failures=row.consecutive_failures,
        version=row.version,
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
        paused=row.paused_at is not None,
        paused_at=timestamp(row.paused_at),
        paused_by=row.paused_by,
        pause_note=row.pause_note,
    )


def skipped_occurrence(row: SkippedOccurrence) -> jobs_pb2.SkippedOccurrence:
    return jobs_pb2.SkippedOccurrence(
        job_id=row.job_id,
        scheduled_at=timestamp(row.scheduled_at),
        reason=row.reason,
        detail=row.detail,
        blocking_run_id=row.blocking_run_id or 0,
        recorded_at=timestamp(row.recorded_at),
    )


def run(row: Run, steps: list[RunStep]) -> runs_pb2.Run:
    overrides: dict[str, Any] = row.overrides or {}
    return runs_pb2.Run(
        id=row.id,
        account_id=row.account_id,
        job_id=row.job_id,
        job_type=JOB_TYPE_TO_PROTO[JobType(row.job_type)],
        status=common_pb2.RunStatus.ValueType(row.status),
        trigger=TRIGGER_TO_PROTO[Trigger(row.trigger)],
        cause=row.cause,
        idempotency_key=row.idempotency_key,
        attempt=row.attempt,
        parent_run_id=row.parent_run_id or 0,
        overrides=runs_pb2.RunOverrides(
            steps=overrides.get("steps", []),
            threads=overrides.get("threads", 0),
            git_branch=overrides.get("git_branch", ""),
            git_sha=overrides.get("git_sha", ""),
            schema=overrides.get("schema", ""),
            timeout_seconds=overrides.get("timeout_seconds", 0),
            pull_request_number=overrides.get("pull_request_number", 0),
            target_name=overrides.get("target_name", ""),
            generate_docs=overrides.get("generate_docs"),
            dbt_version=overrides.get("dbt_version", ""),
        ),
        waiting_reason=row.waiting_reason,
        status_message=row.status_message,
        cancel_requested=row.cancel_requested_at is not None,
        schema=row.schema_name,
        pod_name=row.pod_name,
        cluster=row.cluster,
        scheduled_at=timestamp(row.scheduled_at),
        queued_at=timestamp(row.queued_at),
        dispatched_at=timestamp(row.dispatched_at),
        started_at=timestamp(row.started_at),
        finished_at=timestamp(row.finished_at),
        retries_exhausted=row.retries_exhausted,
        git_sha=row.git_sha,
        job_paused=row.job_paused,
        deferring_run_id=row.deferring_run_id or 0,
        steps=[
            runs_pb2.RunStep(
                index=s.step_index,
                command=s.command,
                status=common_pb2.RunStatus.ValueType(s.status),
                exit_code=s.exit_code or 0,
                started_at=timestamp(s.started_at),
                finished_at=timestamp(s.finished_at),
                skipped=s.skipped_in(RunStatus(row.status).is_terminal),
                end_reason=s.end_reason,
                optional=s.optional,
                setup=s.setup,
            )
            for s in steps
        ],
    )


def log_chunk(row: LogChunk) -> runs_pb2.LogChunk:
    return runs_pb2.LogChunk(
        seq=row.seq, step_index=row.step_index, text=row.text, created_at=timestamp(row.created_at)
    )


def artifact(row: Artifact) -> runs_pb2.Artifact:
    return runs_pb2.Artifact(
        path=row.path,
        step_index=row.step_index,
        size_bytes=row.size_bytes,
        created_at=timestamp(row.created_at),
    )


def project(row: Project) -> projects_pb2.Project:
    return projects_pb2.Project(
        id=row.id,
        account_id=row.account_id,
        name=row.name,
        repository_url=row.repository_url,
        subdirectory=row.subdirectory,
        git_credential_kind=GIT_CREDENTIAL_KINDS[row.git_credential_kind],
        git_credential_set=bool(row.git_credential),
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
        version=row.version,
    )


def environment(row: Environment) -> projects_pb2.Environment:
    return projects_pb2.Environment(
        id=row.id,
        account_id=row.account_id,
        project_id=row.project_id,
        name=row.name,
        environment_type=ENVIRONMENT_TYPES_BY_NAME[row.environment_type],
        dbt_version=row.dbt_version,
        git_branch=row.git_branch,
        adapter_type=row.adapter_type,
        connection_fields=row.connection,
        secret_fields_set=sorted(row.connection_secrets),
        target_name=row.target_name,
        schema=row.schema_name,
        threads=row.threads,
        variables=row.variables,
        secret_variable_names=sorted(row.secret_variables),
        created_at=timestamp(row.created_at),
        updated_at=timestamp(row.updated_at),
        version=row.version,
    )
