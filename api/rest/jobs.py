"""Jobs and accounts as dbt Cloud's v2 reads and writes them (and v3, where dbt Cloud's clients call these).

A job written over REST becomes the same ``JobSpec`` a gRPC request does (dbt Cloud's body is turned
into runplane's request and checked by the same rules), and is written by the same use cases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from pydantic import BaseModel, Field

from api.job_definitions import create_job, delete_job, update_job
from api.lookup import existing_job
from api.pausing import set_paused
from api.rest import params, related, shapes
from api.rest.auth import Account, Caller, Grant
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rest.runs import run_page
from api.rows import CompletionTrigger, Job, JobWithEnvironment
from api.store import JobFilters, RunFilters, Store
from api.validation import JobSpec, checked_idempotency_key, job_spec
from runplane.adapters.db import Connection
from runplane.basics.cron import validate_cron
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.overlap import OVERLAP_TO_PROTO, OverlapPolicy
from runplane.basics.types import AccountId, JobId, RunStatus
from runplane.v1 import common_pb2, jobs_pb2

router = APIRouter(responses=ERROR_RESPONSES)
MAX_LIMIT = 100
JobPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the job")]
Id = Annotated[int, Field(ge=1, le=2**63 - 1)]
JOB_FILTERS = frozenset(
    {
        "project_id",
        "project_id__in",
        "environment_id",
        "name__icontains",
        "state",
        "pk",
        "pk__in",
        "id__gt",
        "dbt_version__in",
        "triggers_schedule",
        "is_system",
        "include_related",
    }
)
# What a job's include_related names: its environment and variables are always in it; the runs are read.
JOB_RELATED = frozenset({"environment", "custom_environment_variables", "most_recent_run", "most_recent_completed_run"})
# dbt Cloud's job filters on what runplane does not know: refused with the reason.
REFUSED_JOB_FILTERS = {"is_fusion_ready": "runplane runs dbt Core and does not assess dbt Fusion readiness"}
# dbt Cloud's job types as runplane's; "adhoc" is what dbt Cloud's newer clients send for "other".
JOB_TYPES = {
    "scheduled": common_pb2.JOB_TYPE_DEPLOY,
    "ci": common_pb2.JOB_TYPE_CI,
    "merge": common_pb2.JOB_TYPE_MERGE,
    "other": common_pb2.JOB_TYPE_ADHOC,
    "adhoc": common_pb2.JOB_TYPE_ADHOC,
}


COMPLETION_MODES = {"any": jobs_pb2.COMPLETION_MODE_ANY, "all": jobs_pb2.COMPLETION_MODE_ALL}
# runplane's field names as dbt Cloud's, in the errors of the shared checks.
JOB_NAMES = {
    "steps": "execute_steps",
    "settings.environment_id": "environment_id",
    "settings.defer_to_job_id": "deferring_job_definition_id",
    "settings.defer_to_environment_id": "deferring_environment_id",
    "settings.run_source_freshness": "run_generate_sources",
    "settings.generate_docs": "generate_docs",
    "settings.timeout_seconds": "execution.timeout_seconds",
    "triggers.schedule.cron": "schedule.cron",
    "triggers.schedule.timezone": "runplane.timezone",
    "triggers.schedule": "schedule",
    "triggers.on_completion": "job_completion_trigger_condition",
    "triggers.on_pull_request": "triggers.github_webhook",
    "triggers.completion_mode": "runplane.completion_mode",
    "settings.retry_max_attempts": "runplane.retry_max_attempts",
    "settings.missed_run_grace_seconds": "runplane.missed_run_grace_seconds",
    "settings.priority": "runplane.priority",
    "settings.git_branch": "runplane.git_branch",
    "settings.schema": "runplane.schema",
    "settings.run_only_modified": "runplane.run_only_modified",
    "settings.environment": "runplane.environment_variables",
    "settings.overlap_policy": "runplane.overlap_policy",
    "settings.jitter_seconds": "runplane.jitter_seconds",
    "settings.catchup_window_seconds": "runplane.catchup_window_seconds",
}


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


class TriggersBody(BaseModel):
    github_webhook: bool = False
    git_provider_webhook: bool = False
    schedule: bool = False
    on_merge: bool = False
    custom_branch_only: bool = False


class SettingsBody(BaseModel):
    threads: int = Field(0, ge=0, le=64, description="dbt threads; 0: the environment's default.")
    target_name: str = Field("", max_length=64)


class ExecutionBody(BaseModel):
    # Bounded only to what the field holds; the shared rule (api.validation) sets the allowed range.
    timeout_seconds: int = Field(0, ge=-(2**31), le=2**31 - 1, description="0: no timeout; at most 86,400.")


class ScheduleDateBody(BaseModel):
    type: str = Field("custom_cron", max_length=40)
    cron: str | None = Field(None, max_length=200)


class ScheduleBody(BaseModel):
    cron: str | None = Field(None, max_length=200, description="Five-field cron, in UTC.")
    date: ScheduleDateBody | None = None


class ConditionBody(BaseModel):
    job_id: Id
    project_id: Id | None = None
    statuses: list[Literal[10, 20, 30]] = Field(
        min_length=1, max_length=3, description="Run statuses: 10, 20 and/or 30."
    )


class CompletionBody(BaseModel):
    condition: ConditionBody


class RunplaneBody(BaseModel):
    """runplane's job settings that dbt Cloud's fields have no name for; a field left out (null) keeps
    its value on an update and takes its default on a create."""

    timezone: str | None = Field(None, max_length=64, description="IANA time zone of schedule.cron (UTC).")
    retry_max_attempts: int | None = Field(None, ge=0, le=10)
    retry_on_step_failure: bool | None = None
    missed_run_grace_seconds: int | None = Field(None, ge=0, le=86400, description="0: skip missed fires.")
    priority: int | None = Field(None, ge=-1000, le=1000, description="Higher dispatches first.")
    git_branch: str | None = Field(None, max_length=255)
    schema_: str | None = Field(None, alias="schema", max_length=63)
    run_only_modified: bool | None = Field(None, description="Slim CI: needs a deferral.")
    completion_mode: str | None = Field(None, pattern="^(any|all)$", description="all: fan-in.")
    overlap_policy: OverlapPolicy | None = Field(
        None, description="What a cron fire does while a run of the job is in progress (serial)."
    )
    jitter_seconds: int | None = Field(None, ge=0, le=3600, description="Fires come up to this much later (0).")
    catchup_window_seconds: int | None = Field(
        None, ge=0, le=604800, description="Fires missed beyond the grace still run this far back (0)."
    )
    catchup_all: bool | None = Field(None, description="Catch up every missed fire in the window, not the newest.")
    environment_variables: dict[str, str] | None = Field(
        None, max_length=100, description="DBT_ENV_SECRET_* values are write-only; an empty one removes it."
    )
    job_completion_trigger_conditions: list[ConditionBody] | None = Field(
        None,
        description="Every completion trigger, first to last ([]: none); job_completion_trigger_condition "
        "is the first, and may be left out or repeat it.",
    )


class JobBody(BaseModel):
    """dbt Cloud's job definition, as its clients create and update jobs."""

    account_id: int | None = Field(None, description="The URL's account, when sent: another is refused.")
    name: str = Field(max_length=255)
    project_id: Id | None = None
    environment_id: Id | None = None
    description: str | None = Field(None, max_length=1000)
    dbt_version: str | None = Field(None, max_length=128)
    execute_steps: list[str] = Field(max_length=100)
    job_type: str = Field("scheduled", max_length=40, description="scheduled, ci, merge or other.")
    triggers: TriggersBody = TriggersBody()
    settings: SettingsBody = SettingsBody()
    execution: ExecutionBody = ExecutionBody()
    schedule: ScheduleBody | None = None
    generate_docs: bool = False
    run_generate_sources: bool = False
    deferring_job_definition_id: Id | None = None
    deferring_environment_id: Id | None = None
    job_completion_trigger_condition: CompletionBody | None = None
    state: int = Field(shapes.ACTIVE, ge=1, le=1, description="1: active (delete a job to set 2).")
    runplane: RunplaneBody | None = None


def job_request(
    body: JobBody, stored: Job | None = None, completion: list[CompletionTrigger] | None = None
) -> jobs_pb2.CreateJobRequest:
    """dbt Cloud's job body as runplane's CreateJobRequest (names in errors stay dbt Cloud's where they differ).

    On an update (``stored``, with its ``completion`` triggers) what dbt Cloud's body cannot say is
    kept: the schedule's time zone while the cron stays, retries, priority, missed-run grace, branch,
    schema, variables, Slim CI while the job still defers, the completion mode, and every completion
    trigger while the body names the first one as it is (``_with_completion_triggers``)."""
    if body.description:
        raise InvalidArgument("description", "runplane keeps no description of a job: leave it empty")
    job_type = JOB_TYPES.get(body.job_type)
    if job_type is None:
        raise InvalidArgument("job_type", f"{body.job_type[:40]!r} is not one of {', '.join(JOB_TYPES)}")
    triggers = jobs_pb2.JobTriggers(
        on_pull_request=body.triggers.github_webhook or body.triggers.git_provider_webhook,
        on_merge=body.triggers.on_merge,
    )
    if body.triggers.schedule:
        cron = _cron_of(body)
        if not cron:
            raise InvalidArgument("schedule.cron", "is required when triggers.schedule is true")
        timezone = stored.timezone if stored is not None and stored.cron == cron else ""
        triggers.schedule.CopyFrom(jobs_pb2.CronSchedule(cron=cron, timezone=timezone))
    _with_completion_triggers(body, stored, completion or [], triggers)
    settings = jobs_pb2.JobSettings(
        threads=body.settings.threads,
        target_name=body.settings.target_name,
        timeout_seconds=body.execution.timeout_seconds,
        environment_id=body.environment_id or 0,
        generate_docs=body.generate_docs,
        run_source_freshness=body.run_generate_sources,
        defer_to_job_id=body.deferring_job_definition_id or 0,
        defer_to_environment_id=body.deferring_environment_id or 0,
        missed_run_grace_seconds=-1,
    )
    if stored is not None:
        settings.environment.update(stored.environment)
        settings.git_branch = stored.git_branch
        settings.retry_max_attempts = stored.retry_max_attempts
        settings.retry_on_step_failure = stored.retry_on_step_failure
        settings.missed_run_grace_seconds = stored.missed_run_grace_seconds
        settings.priority = stored.priority
        settings.overlap_policy = OVERLAP_TO_PROTO[OverlapPolicy(stored.overlap_policy)]
        settings.jitter_seconds = stored.jitter_seconds
        settings.catchup_window_seconds = stored.catchup_window_seconds
        settings.catchup_all = stored.catchup_all
        settings.schema = stored.schema_name
        settings.run_only_modified = stored.run_only_modified and bool(
            settings.defer_to_job_id or settings.defer_to_environment_id
        )
    _with_runplane_settings(body.runplane or RunplaneBody(), triggers, settings)
    return jobs_pb2.CreateJobRequest(
        name=body.name, job_type=job_type, steps=body.execute_steps, triggers=triggers, settings=settings
    )


def _cron_of(body: JobBody) -> str | None:
    """The cron the body's schedule names (``cron``, or a custom cron date), whether the trigger is on or off."""
    schedule = body.schedule or ScheduleBody()
    return schedule.cron or (schedule.date.cron if schedule.date and schedule.date.type == "custom_cron" else None)


def kept_cron(body: JobBody, stored: Job | None) -> str | None:
    """With the schedule trigger off, the cron kept for it as dbt Cloud keeps it: the body's, else the
    one the job had (on or already off); checked as a schedule's cron is."""
    if body.triggers.schedule:
        return None
    cron = _cron_of(body) or (stored.cron or stored.kept_cron if stored is not None else None)
    return None if cron is None else validate_cron(cron, "schedule.cron")


def _with_completion_triggers(
    body: JobBody, stored: Job | None, completion: list[CompletionTrigger], triggers: jobs_pb2.JobTriggers
) -> None:
    """The completion triggers the body sets: all of ``runplane.job_completion_trigger_conditions``,
    or dbt Cloud's one condition. On a job with several, that one must be the first as it is (the
    rest are kept): another would silently drop them, so it is refused."""
    single = body.job_completion_trigger_condition
    listed = body.runplane.job_completion_trigger_conditions if body.runplane else None
    conditions: list[tuple[int, list[common_pb2.RunStatus.ValueType]]]
    if listed is not None:
        conditions = [_condition(c) for c in listed]
        if single is not None and conditions[:1] != [_condition(single.condition)]:
            raise InvalidArgument(
                "job_completion_trigger_condition",
                "must be the first of runplane.job_completion_trigger_conditions, or left out",
            )
    elif single is None:
        conditions = []
    elif completion and _condition(single.condition) == _stored_condition(completion[0]):
        conditions = [_stored_condition(c) for c in completion]
    elif len(completion) > 1:
        raise InvalidArgument(
            "job_completion_trigger_condition",
            f"the job has {len(completion)} completion triggers and this field shows only the first: send "
            "it as it is to keep them all, or set them all in runplane.job_completion_trigger_conditions",
        )
    else:
        conditions = [_condition(single.condition)]
    triggers.on_completion.extend(
        jobs_pb2.CompletionTrigger(upstream_job_id=job_id, statuses=statuses) for job_id, statuses in conditions
    )
    if stored is not None:
        triggers.completion_mode = COMPLETION_MODES[stored.completion_mode]


def _condition(condition: ConditionBody) -> tuple[int, list[common_pb2.RunStatus.ValueType]]:
    return condition.job_id, _statuses(condition.statuses)


def _stored_condition(row: CompletionTrigger) -> tuple[int, list[common_pb2.RunStatus.ValueType]]:
    return row.upstream_job_id, _statuses(row.statuses)


def _statuses(values: Iterable[int]) -> list[common_pb2.RunStatus.ValueType]:
    return sorted(common_pb2.RunStatus.ValueType(s) for s in set(values))


def _with_runplane_settings(
    extra: RunplaneBody, triggers: jobs_pb2.JobTriggers, settings: jobs_pb2.JobSettings
) -> None:
    """runplane's own settings the body names, over what it keeps or defaults."""
    if extra.timezone is not None and triggers.HasField("schedule"):
        triggers.schedule.timezone = extra.timezone
    if extra.completion_mode is not None:
        triggers.completion_mode = COMPLETION_MODES[extra.completion_mode]
    if extra.overlap_policy is not None:
        settings.overlap_policy = OVERLAP_TO_PROTO[extra.overlap_policy]
    for name, value in (
        ("retry_max_attempts", extra.retry_max_attempts),
        ("retry_on_step_failure", extra.retry_on_step_failure),
        ("missed_run_grace_seconds", extra.missed_run_grace_seconds),
        ("priority", extra.priority),
        ("jitter_seconds", extra.jitter_seconds),
        ("catchup_window_seconds", extra.catchup_window_seconds),
        ("catchup_all", extra.catchup_all),
        ("git_branch", extra.git_branch),
        ("schema", extra.schema_),
        ("run_only_modified", extra.run_only_modified),
    ):
        if value is not None:
            setattr(settings, name, value)
    if extra.environment_variables is not None:
        settings.ClearField("environment")
        settings.environment.update(extra.environment_variables)


async def _checked_spec(store: Store, account_id: AccountId, body: JobBody, job_id: int | None = None) -> JobSpec:
    """The spec of ``body`` (over job ``job_id``'s stored definition on an update); its ``project_id``
    must be its environment's (a job belongs to a project through that)."""
    stored, completion = None, None
    if job_id is not None:
        async with store.connection() as conn:
            stored = await existing_job(store, conn, account_id, job_id)
            completion = (await store.completion_triggers(conn, [job_id]))[job_id]
    with params.named_as(JOB_NAMES):
        spec = replace(job_spec(job_request(body, stored, completion)), kept_cron=kept_cron(body, stored))
    env = None
    if body.environment_id is not None:
        async with store.connection() as conn:
            env = await store.get_environment(conn, account_id, body.environment_id)
    if body.project_id is not None:
        if body.environment_id is None:
            raise InvalidArgument(
                "project_id", "a job belongs to a project through its environment: give environment_id"
            )
        if env is not None and env.project_id != body.project_id:
            raise InvalidArgument(
                "project_id", f"environment {body.environment_id} is not in project {body.project_id}"
            )
    if body.dbt_version and (env is None or env.dbt_version != body.dbt_version):
        raise InvalidArgument("dbt_version", "a job runs its environment's dbt version: set it on the environment")
    return spec


async def _one_job(store: Store, conn: Connection, account_id: AccountId, job_id: int) -> shapes.Job:
    (job,) = await related.jobs(store, conn, account_id, [await existing_job(store, conn, account_id, job_id)])
    return job


def _tagged(response: Response, job: shapes.Job) -> shapes.Job:
    """``job``, its version sent as the answer's ETag (what an update's If-Match names)."""
    assert job.runplane is not None
    params.tag(response, job.runplane.version)
    return job


async def _with_recent_runs(
    request: Request, store: Store, conn: Connection, job: shapes.Job, include: set[str]
) -> shapes.Job:
    """``job`` with its most recent run and most recent finished run, when ``include`` names them."""
    found: dict[str, shapes.Run | None] = {}
    for name, statuses in (
        ("most_recent_run", ()),
        ("most_recent_completed_run", tuple(s for s in RunStatus if s.is_terminal)),
    ):
        if name in include:
            latest, _ = await store.runs_by_offset(
                conn,
                AccountId(job.account_id),
                RunFilters(job_id=job.id, statuses=statuses),
                order_by="-id",
                offset=0,
                limit=1,
            )
            found[name] = shapes.run(latest[0], href=run_page(request, latest[0].id)) if latest else None
    return job.model_copy(update=found) if found else job


@router.get("/api/v2/accounts/{account_id}/jobs/", summary="List jobs")
async def list_jobs(
    request: Request,
    account_id: Account,
    *,
    order_by: Annotated[
        str | None, Query(max_length=40, description="id, name, created_at, updated_at; -x descending.")
    ] = None,
    project_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    project_id__in: Annotated[str | None, Query(max_length=2000, description="Project ids, e.g. [1,2].")] = None,
    environment_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    name__icontains: Annotated[
        str | None, Query(max_length=255, pattern=params.PLAIN_TEXT, description="Part of the name, any case.")
    ] = None,
    state: Annotated[
        str | None, Query(max_length=10, description="active (1, the default), deleted (2) or all.")
    ] = None,
    pk: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    pk__in: Annotated[str | None, Query(max_length=2000, description="Job ids, e.g. [1,2].")] = None,
    id__gt: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    dbt_version__in: Annotated[str | None, Query(max_length=2000, description="Its environment's dbt version.")] = None,
    triggers_schedule: Annotated[bool | None, Query(description="Only jobs with (or without) a schedule.")] = None,
    is_system: Annotated[bool | None, Query(description="runplane has no system jobs: true lists none.")] = None,
    include_related: Annotated[
        list[str] | None,
        Query(description="most_recent_run, most_recent_completed_run (environment is always included)."),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
) -> ListEnvelope[shapes.Job]:
    params.refused(request.query_params, REFUSED_JOB_FILTERS)
    params.only_known(request.query_params, JOB_FILTERS)
    store = _store(request)
    order = params.order_by(order_by, params.JOB_ORDERS)
    project_ids = params.ids(project_id__in, "project_id__in") + ((project_id,) if project_id is not None else ())
    job_ids = params.ids(pk__in, "pk__in") + ((pk,) if pk is not None else ())
    versions = params.texts(dbt_version__in, "dbt_version__in")
    which = params.state(state, params.State.ACTIVE)
    include = params.related(include_related, JOB_RELATED)
    filters = JobFilters(
        environment_id=environment_id,
        project_ids=project_ids,
        name_contains=name__icontains,
        deleted=None if which is params.State.ALL else which is params.State.DELETED,
        job_ids=job_ids,
        id_gt=id__gt,
        dbt_versions=versions,
        scheduled=triggers_schedule,
    )
    rows: list[JobWithEnvironment] = []
    total = 0
    async with store.connection() as conn:
        if not is_system:
            rows, total = await store.jobs_by_offset(
                conn, account_id, filters, order_by=order, offset=offset, limit=limit
            )
        jobs = await related.jobs(store, conn, account_id, rows)
        jobs = [await _with_recent_runs(request, store, conn, job, include) for job in jobs]
    echoed: dict[str, Any] = {
        "project_id": project_id,
        "project_id__in": list(project_ids) if project_id__in is not None else None,
        "environment_id": environment_id,
        "name__icontains": name__icontains,
        "state": which.value,
        "pk__in": list(job_ids) or None,
        "id__gt": id__gt,
        "dbt_version__in": list(versions) or None,
        "triggers_schedule": triggers_schedule,
        "is_system": is_system,
    }
    return ListEnvelope[shapes.Job](
        status=success(),
        data=jobs,
        extra=Extra(
            filters={**{k: v for k, v in echoed.items() if v is not None}, "limit": limit, "offset": offset},
            order_by=order,
            pagination=Pagination(count=len(jobs), total_count=total),
        ),
    )


@router.post("/api/v2/accounts/{account_id}/jobs/", summary="Create a job")
async def create_job_(
    request: Request,
    response: Response,
    account_id: Account,
    body: Annotated[JobBody, Body()],
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="A retry with the same key returns the job the first create made and "
            "creates nothing; the same key with another definition is 409.",
        ),
    ] = None,
) -> Envelope[shapes.Job]:
    params.same_account(body.account_id, account_id)
    store = _store(request)
    key = checked_idempotency_key(idempotency_key, "Idempotency-Key")
    params.dbt_versions(request).check(body.dbt_version, "dbt_version")
    spec = await _checked_spec(store, account_id, body)
    with params.named_as(JOB_NAMES):
        created = await create_job(store, account_id, spec, create_key=key and f"rest:{key}")
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, created.id)
    return Envelope[shapes.Job](status=success(), data=_tagged(response, job))


@router.get("/api/v2/accounts/{account_id}/jobs/{job_id}/", summary="Get a job")
async def get_job(request: Request, response: Response, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    store = _store(request)
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=_tagged(response, job))


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/", summary="Update a job")
async def update_job_(
    request: Request,
    response: Response,
    account_id: Account,
    job_id: JobPath,
    *,
    body: Annotated[JobBody, Body()],
    if_match: Annotated[
        str | None,
        Header(
            alias="If-Match",
            description="The job's version (its ETag, or runplane.version): the update is refused with 409, "
            "naming the current version, when the job was saved since.",
        ),
    ] = None,
) -> Envelope[shapes.Job]:
    """Replaces the job's definition with the body, as dbt Cloud does, keeping what the body cannot say
    (time zone, retries, priority, ...); saving a job reactivates it."""
    params.same_account(body.account_id, account_id)
    store = _store(request)
    version = params.expected_version(if_match)
    params.dbt_versions(request).check(body.dbt_version, "dbt_version")
    spec = await _checked_spec(store, account_id, body, job_id)
    with params.named_as(JOB_NAMES):
        await update_job(store, account_id, JobId(job_id), spec, expected_version=version)
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=_tagged(response, job))


@router.delete("/api/v2/accounts/{account_id}/jobs/{job_id}/", summary="Delete a job")
async def delete_job_(request: Request, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    """Its queued runs end cancelled; the answer is the job as it was, with state 2 (deleted).

    dbt Cloud's OpenAPI document says 204 (no body), but its clients (dbtc, dbt-cloud-cli) read the
    deleted object from the answer, as dbt Cloud sends it: 200 with the body keeps them working."""
    store = _store(request)
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, job_id)
    await delete_job(store, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=job.model_copy(update={"state": shapes.DELETED}))


class PauseBody(BaseModel):
    note: str = Field("", max_length=1000, description="Why; kept with who paused the job, shown with it.")


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/pause/", summary="Pause a job")
async def pause_job(
    request: Request, account_id: Account, job_id: JobPath, body: Annotated[PauseBody | None, Body()] = None
) -> Envelope[shapes.Job]:
    """Nothing automatic queues a paused job (schedule, completion, Git events, retries); run now still does.
    The optional note is kept with the caller's token as who paused it (``runplane.pause_note``, ``paused_by``)."""
    store = _store(request)
    note = body.note if body is not None else ""
    await set_paused(store, account_id, job_id, paused=True, who=getattr(request.state, "who", ""), note=note)
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=job)


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/unpause/", summary="Unpause a job")
async def unpause_job(request: Request, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    store = _store(request)
    await set_paused(store, account_id, job_id, paused=False)
    async with store.connection() as conn:
        job = await _one_job(store, conn, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=job)


@router.get("/api/v2/accounts/", summary="List the accounts this token can use")
async def list_accounts(request: Request, caller: Caller) -> Envelope[list[shapes.Account]]:
    async with _store(request).connection() as conn:
        row = await _store(request).get_account(conn, caller)
    return Envelope[list[shapes.Account]](status=success(), data=[] if row is None else [shapes.account(row)])


@router.get("/api/v2/accounts/{account_id}/", summary="Get an account")
async def get_account(request: Request, account_id: Account) -> Envelope[shapes.Account]:
    async with _store(request).connection() as conn:
        row = await _store(request).get_account(conn, account_id)
    if row is None:
        raise NotFound(f"account {account_id} not found")
    return Envelope[shapes.Account](status=success(), data=shapes.account(row))


@router.get(
    "/api/v2/accounts/{account_id}/jobs/{job_id}/skipped-occurrences/", summary="List a job's skipped occurrences"
)
async def list_skipped_occurrences(
    request: Request,
    account_id: Account,
    job_id: JobPath,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
) -> ListEnvelope[shapes.SkippedOccurrence]:
    """The job's cron occurrences that got no run (its overlap policy skipped them), newest first."""
    store = _store(request)
    async with store.connection() as conn:
        job = await existing_job(store, conn, account_id, job_id)
        rows = await store.skipped_occurrences(conn, account_id, JobId(job.id), limit=limit)
    return ListEnvelope[shapes.SkippedOccurrence](
        status=success(),
        data=[shapes.skipped_occurrence(r) for r in rows],
        extra=Extra(
            filters={"limit": limit},
            order_by="-scheduled_at",
            pagination=Pagination(count=len(rows), total_count=len(rows)),
        ),
    )


@router.get("/api/v2/accounts/{account_id}/users/", summary="Who the calling token is")
async def list_users(account_id: Account, grant: Grant) -> ListEnvelope[shapes.User]:
    """One user: the calling API token, with its account permissions (its scopes). runplane keeps no
    people: the answer says what the token may do, not who holds it."""
    user = shapes.token_user(account_id, grant.scopes)
    return ListEnvelope[shapes.User](
        status=success(),
        data=[user],
        extra=Extra(filters={"limit": 1, "offset": 0}, order_by="id", pagination=Pagination(count=1, total_count=1)),
    )
