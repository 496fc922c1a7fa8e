"""What a run of a job with an environment needs to run dbt: one home for assembling it.

The control plane (which knows projects, environments, jobs and runs) builds a :class:`DbtContext`
for a run from its row (a :class:`ContextRow`, read by ``api.runner.run_spec.load_dbt_context`` at
the claim; :func:`context_from_row`) and sends it in the run's ``RunSpec``; the runner gets it whole
and prepares the run from it (checkout, profile, step environment) without reading anything else.
The precedence rules live here: run override > job setting > environment default, and a CI run's
schema is always its pull-request schema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runplane.basics.run_overrides import run_override
from runplane.basics.types import (
    JOB_TYPE_FROM_PROTO,
    JOB_TYPE_TO_PROTO,
    TRIGGER_FROM_PROTO,
    TRIGGER_TO_PROTO,
    AccountId,
    JobId,
    JobType,
    RunId,
    Trigger,
)
from runplane.dbt import fields
from runplane.v1 import projects_pb2

# The macro a pull request's schema drop run calls (runplane.runs.pull_requests; runner/macros.py).
DROP_SCHEMA_MACRO = "runplane_drop_pull_request_schema"


@dataclass(frozen=True, slots=True)
class ContextRow:
    """What the control plane knows of a run of a job with an environment, one field per column of
    the API's ``dbt_context`` query in its order: the run, its job's settings (``job_*``: empty or 0
    when unset), its environment's and its project's. ``connection_secrets``, ``secret_variables``
    and ``git_credential`` hold ciphertext."""

    run_id: RunId
    job_id: JobId
    account_id: AccountId
    job_type: str
    trigger: str
    cause: str
    overrides: dict[str, Any]
    run_schema: str
    pull_request_number: int | None
    job_schema: str
    job_target_name: str
    job_threads: int
    job_git_branch: str
    environment_id: int
    environment_type: str
    dbt_version: str
    environment_git_branch: str
    adapter_type: str
    connection: dict[str, str]
    connection_secrets: dict[str, str] = field(repr=False)
    environment_target_name: str
    environment_schema: str
    environment_threads: int
    variables: dict[str, str]
    secret_variables: dict[str, str] = field(repr=False)
    project_id: int
    repository_url: str
    subdirectory: str
    git_credential_kind: str
    git_credential: str = field(repr=False)


@dataclass(frozen=True)
class DbtContext:
    """Everything a runner needs to check out a project and run dbt in an environment.

    The secret fields (``git_credential``, ``connection_secrets``, ``secret_variables``) hold plain
    text: the value is built for one run, travels only to its runner, and is masked in everything the
    run writes.
    """

    run_id: int
    job_id: int
    account_id: int
    project_id: int
    environment_id: int
    environment_type: str  # deployment | development
    job_type: JobType
    trigger: Trigger
    cause: str
    repository_url: str
    subdirectory: str
    git_credential_kind: str  # none | token | ssh_key
    git_credential: str = field(repr=False)
    git_sha: str  # requested commit; empty: the branch's head
    git_branch: str  # empty: the repository's default branch
    dbt_version: str
    adapter_type: str
    connection: Mapping[str, str]
    connection_secrets: Mapping[str, str] = field(repr=False)
    target_name: str
    schema: str
    threads: int
    variables: Mapping[str, str]
    pull_request_number: int | None
    drop_schema: bool = False  # a pull request's schema drop run (runplane.runs.pull_requests)
    # The environment's DBT_ENV_SECRET_* variables; steps get them over ``variables``, under the job's.
    secret_variables: Mapping[str, str] = field(default_factory=dict, repr=False)

    def secrets(self) -> list[str]:
        """The values to mask wherever the run writes text."""
        values = [self.git_credential, *self.connection_secrets.values(), *self.secret_variables.values()]
        return [v for v in values if v]

    def run_reason_category(self) -> str:
        """dbt Cloud's category of the trigger: scheduled, github_pull_request, retry or other."""
        match self.trigger:
            case Trigger.SCHEDULE:
                return "scheduled"
            case Trigger.CI | Trigger.MERGE:
                return "github_pull_request"
            case Trigger.RETRY:
                return "retry"
            case _:
                return "other"

    def invocation_context(self) -> str:
        """dbt Cloud's invocation context: ci for pull-request runs, else prod or dev by environment."""
        if self.job_type is JobType.CI:
            return "ci"
        return "prod" if self.environment_type == "deployment" else "dev"


def effective_run_reason(trigger: Trigger, cause: str) -> str:
    """What dbt Cloud exports as ``DBT_CLOUD_RUN_REASON``: the cause, else the trigger in words."""
    if cause.strip():
        return cause.strip()
    return {
        Trigger.SCHEDULE: "Scheduled",
        Trigger.API: "Triggered via API",
        Trigger.MANUAL: "Run now",
        Trigger.CI: "Pull request",
        Trigger.MERGE: "Merged pull request",
        Trigger.COMPLETION: "Another job finished",
        Trigger.RETRY: "Retry",
    }[trigger]


def effective_schema(
    job_type: JobType, run_schema: str, overrides: Mapping[str, Any], job_schema: str, environment_schema: str
) -> str:
    """The schema a run builds in: a CI run's pull-request schema (set at trigger time); otherwise the
    run's override, the job's, the environment's."""
    if job_type is JobType.CI:
        return run_schema
    return str(run_override(overrides, "schema") or job_schema or environment_schema)


def context_from_row(row: ContextRow, decrypt: Callable[[str], str]) -> DbtContext:
    """The run's DbtContext from its row, secrets decrypted with ``decrypt``."""
    overrides: Mapping[str, Any] = row.overrides if isinstance(row.overrides, dict) else {}
    job_type = JobType(row.job_type)
    schema = effective_schema(job_type, row.run_schema, overrides, row.job_schema, row.environment_schema)
    trigger = Trigger(row.trigger)
    return DbtContext(
        run_id=row.run_id,
        job_id=row.job_id,
        account_id=row.account_id,
        project_id=row.project_id,
        environment_id=row.environment_id,
        environment_type=row.environment_type,
        job_type=job_type,
        trigger=trigger,
        cause=effective_run_reason(trigger, row.cause),
        repository_url=row.repository_url,
        subdirectory=row.subdirectory,
        git_credential_kind=row.git_credential_kind,
        git_credential=decrypt(row.git_credential) if row.git_credential else "",
        git_sha=str(run_override(overrides, "git_sha") or ""),
        git_branch=str(run_override(overrides, "git_branch") or row.job_git_branch or row.environment_git_branch),
        dbt_version=str(run_override(overrides, "dbt_version") or row.dbt_version),
        adapter_type=row.adapter_type,
        connection={str(k): str(v) for k, v in row.connection.items()},
        connection_secrets={str(k): decrypt(str(v)) for k, v in row.connection_secrets.items()},
        target_name=str(run_override(overrides, "target_name") or row.job_target_name or row.environment_target_name),
        schema=schema,
        threads=int(
            run_override(overrides, "threads") or row.job_threads or row.environment_threads or fields.DEFAULT_THREADS
        ),
        variables={str(k): str(v) for k, v in row.variables.items()},
        pull_request_number=row.pull_request_number or None,
        drop_schema=job_type is JobType.CI and bool(overrides.get("drop_schema")),
        secret_variables={str(k): decrypt(str(v)) for k, v in row.secret_variables.items()},
    )


def to_proto(context: DbtContext) -> projects_pb2.DbtContext:
    """The message that carries a DbtContext to the run's runner."""
    return projects_pb2.DbtContext(
        run_id=context.run_id,
        job_id=context.job_id,
        account_id=context.account_id,
        project_id=context.project_id,
        environment_id=context.environment_id,
        environment_type=context.environment_type,
        job_type=JOB_TYPE_TO_PROTO[context.job_type],
        trigger=TRIGGER_TO_PROTO[context.trigger],
        cause=context.cause,
        repository_url=context.repository_url,
        subdirectory=context.subdirectory,
        git_credential_kind=context.git_credential_kind,
        git_credential=context.git_credential,
        git_sha=context.git_sha,
        git_branch=context.git_branch,
        dbt_version=context.dbt_version,
        adapter_type=context.adapter_type,
        connection=dict(context.connection),
        connection_secrets=dict(context.connection_secrets),
        target_name=context.target_name,
        schema=context.schema,
        threads=context.threads,
        variables=dict(context.variables),
        pull_request_number=context.pull_request_number or 0,
        drop_schema=context.drop_schema,
        secret_variables=dict(context.secret_variables),
    )


def from_proto(message: projects_pb2.DbtContext) -> DbtContext:
    return DbtContext(
        run_id=message.run_id,
        job_id=message.job_id,
        account_id=message.account_id,
        project_id=message.project_id,
        environment_id=message.environment_id,
        environment_type=message.environment_type,
        job_type=JOB_TYPE_FROM_PROTO[message.job_type],
        trigger=TRIGGER_FROM_PROTO[message.trigger],
        cause=message.cause,
        repository_url=message.repository_url,
        subdirectory=message.subdirectory,
        git_credential_kind=message.git_credential_kind,
        git_credential=message.git_credential,
        git_sha=message.git_sha,
        git_branch=message.git_branch,
        dbt_version=message.dbt_version,
        adapter_type=message.adapter_type,
        connection=dict(message.connection),
        connection_secrets=dict(message.connection_secrets),
        target_name=message.target_name,
        schema=message.schema,
        threads=message.threads,
        variables=dict(message.variables),
        pull_request_number=message.pull_request_number or None,
        drop_schema=message.drop_schema,
        secret_variables=dict(message.secret_variables),
    )
