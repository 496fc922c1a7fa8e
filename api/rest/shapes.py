"""runplane rows in dbt Cloud's v2 shapes.

Field names, types and meanings follow dbt Cloud's API. What runplane does not have (thread ids,
S3 paths, connection and credential ids: a connection is part of its environment here) is null,
never made up. Secret fields are never in an answer: an environment names the ones that are set. Timestamps are
written as dbt Cloud writes them (``2024-05-01 12:00:00.123456+00:00``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from api import rows
from api.rerunning import retry_refusal
from runplane.basics.types import JobType, RunStatus
from runplane.dbt.connections import typed_fields

# dbt Cloud's job types; runplane's deploy jobs are its "scheduled" ones, adhoc its "other".
JOB_TYPES = {JobType.DEPLOY: "scheduled", JobType.CI: "ci", JobType.MERGE: "merge", JobType.ADHOC: "other"}
# Colours of dbt Cloud's run and step statuses, as its API returns them.
STATUS_COLORS = {1: "#C0C0C0", 2: "#C0C0C0", 3: "#008000", 10: "#008000", 20: "#FF0000", 30: "#FFA500"}
SKIPPED_COLOR = "#C0C0C0"
ACTIVE, DELETED = 1, 2
# A step's id is its run's times this, plus its index and one (steps per run stay below it).
STEPS_PER_RUN = 1000
# How dbt Cloud names the way a repository is cloned, by runplane's kind of git credential.
CLONE_STRATEGIES = {"ssh_key": "deploy_key", "token": "deploy_token"}


def stamp(value: datetime | None) -> str | None:
    return None if value is None else str(value)


def humanized(status: int) -> str:
    try:
        return {10: "Success", 20: "Error", 30: "Cancelled"}.get(status, RunStatus(status).name.title())
    except ValueError:
        return "Unknown"


def clock(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return str(timedelta(seconds=int(max(0.0, seconds)))).zfill(8)


def human_seconds(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    s = int(max(0.0, seconds))
    minutes, s = divmod(s, 60)
    return f"{minutes} minutes, {s} seconds" if minutes else f"{s} seconds"


def _between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or datetime.now(start.tzinfo)) - start).total_seconds()


class Account(BaseModel):
    id: int
    name: str
    state: int
    plan: str | None
    run_slots: int
    deactivate_after_failures: int
    created_at: str | None
    updated_at: str | None


class JobSettings(BaseModel):
    threads: int
    target_name: str


class JobExecution(BaseModel):
    timeout_seconds: int


class JobTriggers(BaseModel):
    github_webhook: bool
    git_provider_webhook: bool
    schedule: bool
    on_merge: bool
    custom_branch_only: bool


class ScheduleDate(BaseModel):
    type: str
    cron: str | None


class ScheduleTime(BaseModel):
    type: str


class JobSchedule(BaseModel):
    """A job's schedule: dbt Cloud's jobs answer ``date`` and ``time`` as objects, the job inside a run
    (its ``InternalJobDefinition``) as their type names (``as_in_run``)."""

    cron: str | None
    date: ScheduleDate | str
    time: ScheduleTime | str

    def as_in_run(self) -> JobSchedule:
        date = self.date.type if isinstance(self.date, ScheduleDate) else self.date
        time = self.time.type if isinstance(self.time, ScheduleTime) else self.time
        return JobSchedule(cron=self.cron, date=date, time=time)


class Repository(BaseModel):
    id: int
    account_id: int
    project_id: int
    remote_url: str
    remote_backend: str
    git_clone_strategy: str | None
    git_credential_set: bool
    state: int
    created_at: str | None
    updated_at: str | None


class Project(BaseModel):
    id: int
    account_id: int
    name: str
    description: str
    dbt_project_subdirectory: str | None
    connection_id: int | None
    repository_id: int
    repository: Repository
    state: int
    created_at: str | None
    updated_at: str | None


class Connection(BaseModel):
    type: str
    details: dict[str, str]
    secrets_set: list[str]


class Credentials(BaseModel):
    schema_: str = Field(alias="schema")
    threads: int
    target_name: str

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class EnvironmentVariable(BaseModel):
    """One of an environment's plain variables, as dbt Cloud's v2 environments list them."""

    account_id: int
    project_id: int
    environment_id: int
    name: str
    type: str  # "environment": set on the environment
    display_value: str
    state: int


class Environment(BaseModel):
    id: int
    account_id: int
    project_id: int
    name: str
    type: str
    description: str
    deployment_type: str | None
    dbt_version: str
    use_custom_branch: bool
    custom_branch: str | None
    # The plain ones: by name (v3), or as dbt Cloud's v2 variables (``as_v2``).
    custom_environment_variables: dict[str, str] | list[EnvironmentVariable]
    secret_variable_names: list[str]  # DBT_ENV_SECRET_* that are set; their values are never returned
    connection_id: int | None
    credentials_id: int | None
    connection: Connection
    credentials: Credentials
    state: int
    created_at: str | None
    updated_at: str | None

    def as_v2(self) -> Environment:
        """The environment as v2's paths answer it: its variables a list of dbt Cloud's variable objects."""
        if not isinstance(self.custom_environment_variables, dict):
            return self
        listed = [
            EnvironmentVariable(
                account_id=self.account_id,
                project_id=self.project_id,
                environment_id=self.id,
                name=name,
                type="environment",
                display_value=value,
                state=ACTIVE,
            )
            for name, value in sorted(self.custom_environment_variables.items())
        ]
        return self.model_copy(update={"custom_environment_variables": listed})


class CompletionCondition(BaseModel):
    job_id: int
    project_id: int | None
    statuses: list[int]


class CompletionTrigger(BaseModel):
    condition: CompletionCondition


class RunplaneJobSettings(BaseModel):
    """runplane's job settings that dbt Cloud's fields have no name for (REST sets them the same way)."""

    timezone: str
    retry_max_attempts: int
    retry_on_step_failure: bool
    missed_run_grace_seconds: int
    priority: int
    git_branch: str
    schema_: str = Field(alias="schema")
    run_only_modified: bool
    completion_mode: str
    overlap_policy: str
    jitter_seconds: int
    catchup_window_seconds: int
    catchup_all: bool
    environment_variables: dict[str, str]
    secret_names: list[str]  # DBT_ENV_SECRET_* that are set; their values are never returned
    job_completion_trigger_conditions: list[CompletionCondition]  # job_completion_trigger_condition: the first
    version: int  # read only: each save bumps it; an update's If-Match names it
    paused_by: str = ""  # read only: who paused the job (pause/ sets it)
    pause_note: str = ""  # read only: why, as pause/ was given it
    deactivation_reason: str = ""  # read only: why the job was deactivated (after failing, ...)

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class Job(BaseModel):
    id: int
    account_id: int
    project_id: int | None
    environment_id: int | None
    name: str
    description: str
    dbt_version: str | None
    job_type: str
    execute_steps: list[str]
    triggers: JobTriggers
    settings: JobSettings
    execution: JobExecution
    schedule: JobSchedule
    state: int
    deactivated: bool
    paused: bool
    run_failure_count: int
    generate_docs: bool
    run_generate_sources: bool
    deferring_job_definition_id: int | None
    deferring_environment_id: int | None
    job_completion_trigger_condition: CompletionTrigger | None
    created_at: str | None
    updated_at: str | None
    environment: Environment | None = None
    project: Project | None = None
    runplane: RunplaneJobSettings | None = None
    # Read only when include_related names them (a job list's).
    most_recent_run: Run | None = None
    most_recent_completed_run: Run | None = None


class Trigger(BaseModel):
    id: int
    cause: str
    cause_humanized: str
    job_definition_id: int
    git_branch: str | None
    git_sha: str | None
    github_pull_request_id: int | None
    gitlab_merge_request_id: int | None
    azure_pull_request_id: int | None
    schema_override: str | None
    dbt_version_override: str | None
    threads_override: int | None
    target_name_override: str | None
    generate_docs_override: bool | None
    timeout_seconds_override: int | None
    steps_override: list[str] | None
    created_at: str | None


class RunStep(BaseModel):
    id: int
    run_id: int
    account_id: int
    index: int
    status: int
    status_color: str
    status_humanized: str
    name: str
    logs: str
    debug_logs: str | None
    log_location: str
    truncated_debug_logs: str | None
    created_at: str | None
    updated_at: str | None
    started_at: str | None
    finished_at: str | None
    duration: str | None
    duration_humanized: str | None


class Run(BaseModel):
    id: int
    trigger_id: int
    account_id: int
    environment_id: int | None
    project_id: int | None
    job_definition_id: int
    job_id: int
    status: int
    status_humanized: str
    status_message: str | None
    job_paused: bool
    dbt_version: str | None
    git_branch: str | None
    git_sha: str | None
    owner_thread_id: str | None
    executed_by_thread_id: str | None
    deferring_run_id: int | None
    artifacts_saved: bool
    artifact_s3_path: str | None
    has_docs_generated: bool
    has_sources_generated: bool
    notifications_sent: bool
    blocked_by: list[int]
    created_at: str | None
    updated_at: str | None
    dequeued_at: str | None
    started_at: str | None
    finished_at: str | None
    last_checked_at: str | None
    last_heartbeat_at: str | None
    should_start_at: str | None
    in_progress: bool
    is_complete: bool
    is_success: bool
    is_error: bool
    is_cancelled: bool
    is_running: bool
    href: str
    duration: str | None
    queued_duration: str | None
    run_duration: str | None
    duration_humanized: str | None
    queued_duration_humanized: str | None
    run_duration_humanized: str | None
    created_at_humanized: str | None
    finished_at_humanized: str | None
    retrying_run_id: int | None
    can_retry: bool
    retry_not_supported_reason: str | None  # dbt Cloud's RetryNotSupportedReasonEnum; None when it can
    waiting_reason: str
    reattached: bool = False  # runplane's: a reattaching trigger was given this run, already in progress
    trigger: Trigger | None = None
    job: Job | None = None
    environment: Environment | None = None
    project: Project | None = None
    repository: Repository | None = None
    run_steps: list[RunStep] = []
    run_retries: list[Run] = []
    deferring_run: Run | None = None
    # Not recorded by runplane: null (unknown), whatever include_related asks.
    used_repo_cache: bool | None = None
    audit: dict[str, Any] | None = None


Job.model_rebuild()  # its most recent runs are Runs, defined after it


class UserPermission(BaseModel):
    """What the calling token may do in an account, in the words of dbt Cloud's user permissions."""

    account_id: int
    license_type: str  # developer, or read_only for a token that may only read
    permission_sets: list[str]  # the token's scopes: read_only, job_admin, account_admin
    state: int


class User(BaseModel):
    """dbt Cloud's user, answered for the calling API token: a token is not a person, so what only a
    person has (an id, a name, an e-mail address, logins) is null or empty, never made up."""

    id: int | None
    first_name: str
    last_name: str
    email: str | None
    is_active: bool
    is_staff: bool
    created_at: str | None
    last_login: str | None
    apitoken_last_used: str | None
    permissions: list[UserPermission]
    licenses: dict[str, str]


def token_user(account_id: int, scopes: frozenset[str]) -> User:
    license_type = "read_only" if scopes <= {"read_only"} else "developer"
    permission = UserPermission(
        account_id=account_id, license_type=license_type, permission_sets=sorted(scopes), state=ACTIVE
    )
    return User(
        id=None,
        first_name="",
        last_name="",
        email=None,
        is_active=True,
        is_staff=False,
        created_at=None,
        last_login=None,
        apitoken_last_used=None,
        permissions=[permission],
        licenses={str(account_id): license_type},
    )


def account(row: rows.Account) -> Account:
    return Account(
        id=row.id,
        name=row.name,
        state=ACTIVE,
        plan=None,
        run_slots=row.run_slots,
        deactivate_after_failures=row.deactivate_after_failures,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


def repository(row: rows.Project | rows.Repository) -> Repository:
    """A project's git repository (runplane keeps it on the project: the id of the repository it was
    attached to, else the project's), or a repository made on its own in a project."""
    if isinstance(row, rows.Project):
        repository_id, project_id, url = row.repository_id or row.id, row.id, row.repository_url
    else:
        repository_id, project_id, url = row.id, row.project_id, row.remote_url
    host = urlsplit(url).hostname or url.partition("@")[2].partition(":")[0]
    backend = next((name for name in ("github", "gitlab") if host.endswith(f"{name}.com")), "manual_config")
    return Repository(
        id=repository_id,
        account_id=row.account_id,
        project_id=project_id,
        remote_url=url,
        remote_backend=backend,
        git_clone_strategy=CLONE_STRATEGIES.get(row.git_credential_kind),
        git_credential_set=bool(row.git_credential),
        state=ACTIVE,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


def project(row: rows.Project) -> Project:
    return Project(
        id=row.id,
        account_id=row.account_id,
        name=row.name,
        description=row.description,
        dbt_project_subdirectory=row.subdirectory or None,
        connection_id=None,
        repository_id=row.repository_id or row.id,
        repository=repository(row),
        state=ACTIVE,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


def environment(row: rows.Environment) -> Environment:
    branch: str = row.git_branch
    return Environment(
        id=row.id,
        account_id=row.account_id,
        project_id=row.project_id,
        name=row.name,
        type=row.environment_type,
        description=row.description,
        deployment_type=row.deployment_type,
        dbt_version=row.dbt_version,
        use_custom_branch=bool(branch),
        custom_branch=branch or None,
        custom_environment_variables=dict(row.variables),
        secret_variable_names=sorted(row.secret_variables),
        connection_id=row.connection_id,
        credentials_id=row.credentials_id,
        connection=Connection(
            type=row.adapter_type, details=dict(row.connection), secrets_set=sorted(row.connection_secrets)
        ),
        credentials=Credentials.model_validate(
            {"schema": row.schema_name, "threads": row.threads, "target_name": row.target_name}
        ),
        state=ACTIVE,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


def completion_conditions(
    triggers: list[rows.CompletionTrigger], projects_of_jobs: dict[int, int | None]
) -> list[CompletionCondition]:
    """A job's completion triggers as dbt Cloud's conditions, first to last."""
    return [
        CompletionCondition(
            job_id=int(t.upstream_job_id),
            project_id=projects_of_jobs.get(int(t.upstream_job_id)),
            statuses=sorted(t.statuses),
        )
        for t in triggers
    ]


def job(
    row: rows.JobWithEnvironment,
    *,
    environment_of: Environment | None = None,
    project_of: Project | None = None,
    completion: list[CompletionCondition] | None = None,
) -> Job:
    """``completion``: every completion trigger; dbt Cloud's one condition shows the first."""
    conditions = completion or []
    cron: str | None = row.cron or row.kept_cron  # a schedule turned off keeps its cron, as in dbt Cloud
    job_type = JobType(row.job_type)
    return Job(
        id=row.id,
        account_id=row.account_id,
        project_id=row.project_id,
        environment_id=row.environment_id,
        name=row.name,
        description="",
        dbt_version=row.dbt_version,
        job_type=JOB_TYPES[job_type],
        execute_steps=list(row.steps),
        triggers=JobTriggers(
            github_webhook=bool(row.on_pull_request),
            git_provider_webhook=bool(row.on_pull_request),
            schedule=row.cron is not None,
            on_merge=bool(row.on_merge),
            custom_branch_only=bool(row.git_branch),
        ),
        settings=JobSettings(threads=row.threads, target_name=row.target_name),
        execution=JobExecution(timeout_seconds=row.timeout_seconds),
        schedule=JobSchedule(
            cron=cron,
            date=ScheduleDate(type="custom_cron" if cron else "every_day", cron=cron),
            time=ScheduleTime(type="every_hour" if cron is None else "custom"),
        ),
        state=DELETED if row.deleted_at else ACTIVE,
        deactivated=row.deactivated_at is not None,
        paused=row.paused_at is not None,
        run_failure_count=row.consecutive_failures,
        generate_docs=row.generate_docs,
        run_generate_sources=row.run_source_freshness,
        deferring_job_definition_id=row.defer_to_job_id,
        deferring_environment_id=row.defer_to_environment_id,
        job_completion_trigger_condition=CompletionTrigger(condition=conditions[0]) if conditions else None,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
        environment=environment_of,
        project=project_of,
        runplane=RunplaneJobSettings.model_validate(
            {
                "timezone": row.timezone,
                "retry_max_attempts": row.retry_max_attempts,
                "retry_on_step_failure": row.retry_on_step_failure,
                "missed_run_grace_seconds": row.missed_run_grace_seconds,
                "priority": row.priority,
                "git_branch": row.git_branch,
                "schema": row.schema_name,
                "run_only_modified": row.run_only_modified,
                "completion_mode": row.completion_mode,
                "overlap_policy": row.overlap_policy,
                "jitter_seconds": row.jitter_seconds,
                "catchup_window_seconds": row.catchup_window_seconds,
                "catchup_all": row.catchup_all,
                "environment_variables": dict(row.environment),
                "secret_names": sorted(row.secret_environment),
                "job_completion_trigger_conditions": conditions,
                "version": row.version,
                "paused_by": row.paused_by,
                "pause_note": row.pause_note,
                "deactivation_reason": row.deactivation_reason,
            }
        ),
    )


def trigger(row: rows.Run) -> Trigger:
    o: dict[str, Any] = row.overrides or {}
    provider = o.get("pull_request_provider", "github")
    pr = row.pull_request_number
    return Trigger(
        id=row.id,
        cause=row.cause,
        cause_humanized=row.cause,
        job_definition_id=row.job_id,
        git_branch=o.get("git_branch"),
        git_sha=o.get("git_sha"),
        github_pull_request_id=pr if provider == "github" else None,
        gitlab_merge_request_id=pr if provider == "gitlab" else None,
        azure_pull_request_id=pr if provider == "azure" else None,
        schema_override=o.get("schema"),
        dbt_version_override=o.get("dbt_version"),
        threads_override=o.get("threads"),
        target_name_override=o.get("target_name"),
        generate_docs_override=o.get("generate_docs"),
        timeout_seconds_override=o.get("timeout_seconds"),
        steps_override=o.get("steps"),
        created_at=stamp(row.queued_at),
    )


def step(run: rows.Run, row: rows.RunStep, logs: str, *, debug_logs: bool) -> RunStep:
    seconds = _between(row.started_at, row.finished_at)
    skipped = row.skipped_in(RunStatus(run.status).is_terminal)
    return RunStep(
        # runplane keys steps by (run, index); this id is derived from them, stable and unique
        # (``GET .../steps/{id}/`` reads it back).
        id=run.id * STEPS_PER_RUN + row.step_index + 1,
        run_id=run.id,
        account_id=run.account_id,
        index=row.step_index + 1,
        status=row.status,
        # dbt Cloud names a step that never ran "Skipped" (its code stays the step's own: the API has no
        # code of its own for it); retrying from a failure reruns such a step instead of reading its artifacts.
        status_color=SKIPPED_COLOR if skipped else STATUS_COLORS.get(row.status, SKIPPED_COLOR),
        status_humanized="Skipped" if skipped else humanized(row.status),
        # A setup step's command is its name ("Clone git repository", …); a command is invoked.
        name=row.command if row.setup else f"Invoke `{row.command}`",
        logs=logs,
        # runplane keeps one log stream per step: the debug log is that stream.
        debug_logs=logs if debug_logs else None,
        log_location="db",
        truncated_debug_logs=logs if debug_logs else None,
        created_at=stamp(row.started_at),
        updated_at=stamp(row.finished_at or row.started_at),
        started_at=stamp(row.started_at),
        finished_at=stamp(row.finished_at),
        duration=clock(seconds),
        duration_humanized=human_seconds(seconds),
    )


def run(
    row: rows.RunWithEnvironment,
    *,
    href: str,
    docs: frozenset[str] | set[str] = frozenset(),
    trigger_of: Trigger | None = None,
    job_of: Job | None = None,
    environment_of: Environment | None = None,
    project_of: Project | None = None,
    repository_of: Repository | None = None,
    steps: list[RunStep] | None = None,
    retries: list[Run] | None = None,
    deferring: Run | None = None,
) -> Run:
    """``docs``: which of ``target/catalog.json`` and ``target/sources.json`` the run kept."""
    status = int(row.status)
    o: dict[str, Any] = row.overrides or {}
    terminal = RunStatus(status).is_terminal
    total = _between(row.queued_at, row.finished_at)
    queued = _between(row.queued_at, row.started_at or row.finished_at)
    ran = _between(row.started_at, row.finished_at)
    return Run(
        id=row.id,
        trigger_id=row.id,
        account_id=row.account_id,
        environment_id=row.environment_id,
        project_id=row.project_id,
        job_definition_id=row.job_id,
        job_id=row.job_id,
        status=status,
        status_humanized=humanized(status),
        status_message=row.status_message or None,
        job_paused=row.job_paused,
        dbt_version=o.get("dbt_version") or row.dbt_version,
        git_branch=o.get("git_branch"),
        # The commit the run checked out, else the one it asked for.
        git_sha=row.git_sha or o.get("git_sha"),
        owner_thread_id=None,
        executed_by_thread_id=row.pod_name or None,
        deferring_run_id=row.deferring_run_id,
        artifacts_saved=terminal,
        artifact_s3_path=None,
        has_docs_generated="target/catalog.json" in docs,
        has_sources_generated="target/sources.json" in docs,
        notifications_sent=terminal,
        blocked_by=[],
        created_at=stamp(row.queued_at),
        updated_at=stamp(row.finished_at or row.started_at or row.dispatched_at or row.queued_at),
        dequeued_at=stamp(row.dispatched_at),
        started_at=stamp(row.started_at),
        finished_at=stamp(row.finished_at),
        last_checked_at=stamp(row.heartbeat_at),
        last_heartbeat_at=stamp(row.heartbeat_at),
        should_start_at=stamp(row.scheduled_at),
        in_progress=not terminal,
        is_complete=terminal,
        is_success=status == RunStatus.SUCCESS,
        is_error=status == RunStatus.ERROR,
        is_cancelled=status == RunStatus.CANCELLED,
        is_running=status == RunStatus.RUNNING,
        href=href,
        duration=clock(total),
        queued_duration=clock(queued),
        run_duration=clock(ran),
        duration_humanized=human_seconds(total),
        queued_duration_humanized=human_seconds(queued),
        run_duration_humanized=human_seconds(ran),
        created_at_humanized=human_seconds(_between(row.queued_at, None)),
        finished_at_humanized=human_seconds(_between(row.finished_at, None)),
        retrying_run_id=row.parent_run_id,
        can_retry=retry_refusal(row) is None,
        retry_not_supported_reason=retry_refusal(row),
        waiting_reason=row.waiting_reason,
        trigger=trigger_of,
        job=job_of,
        environment=environment_of,
        project=project_of,
        repository=repository_of,
        run_steps=steps or [],
        run_retries=retries or [],
        deferring_run=deferring,
    )


class SkippedOccurrence(BaseModel):
    """A cron occurrence of a job that got no run, and why (runplane's own)."""

    job_definition_id: int
    scheduled_at: str
    reason: str
    detail: str
    blocking_run_id: int | None
    recorded_at: str


def skipped_occurrence(row: rows.SkippedOccurrence) -> SkippedOccurrence:
    return SkippedOccurrence(
        job_definition_id=row.job_id,
        scheduled_at=str(row.scheduled_at),
        reason=row.reason,
        detail=row.detail,
        blocking_run_id=row.blocking_run_id,
        recorded_at=str(row.recorded_at),
    )


class AccountConnection(BaseModel):
    """A warehouse connection of the account, as dbt Cloud's v3 connections: its details, no secret."""

    id: int
    account_id: int
    name: str
    adapter_version: str
    type: str
    config: dict[str, str | int | bool]  # typed as the adapter's profile types them
    oauth_redirect_uri: str | None
    environment__count: int  # the environments made from it (and not given another connection since)
    state: int
    created_at: str | None
    updated_at: str | None


def account_connection(row: rows.WarehouseConnection, environments: int) -> AccountConnection:
    return AccountConnection(
        id=row.id,
        account_id=row.account_id,
        name=row.name,
        adapter_version=f"{row.adapter_type}_v0",
        type=row.adapter_type,
        config=typed_fields(row.adapter_type, row.details),
        oauth_redirect_uri=None,
        environment__count=environments,
        state=ACTIVE,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


class ProjectCredentials(BaseModel):
    """A project's warehouse credentials, as dbt Cloud's v3 credentials; the secrets are write-only:
    ``secrets_set`` names those that are set."""

    id: int
    account_id: int
    project_id: int
    type: str
    state: int
    threads: int
    username: str | None
    default_schema: str
    target_name: str
    details: dict[str, str]
    secrets_set: list[str]
    created_at: str | None
    updated_at: str | None


def project_credentials(row: rows.Credentials) -> ProjectCredentials:
    return ProjectCredentials(
        id=row.id,
        account_id=row.account_id,
        project_id=row.project_id,
        type=row.adapter_type,
        state=ACTIVE,
        threads=row.threads,
        username=row.details.get("user"),
        default_schema=row.schema_name,
        target_name=row.target_name,
        details=dict(row.details),
        secrets_set=sorted(row.secrets),
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )
