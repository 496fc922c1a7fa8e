"""Runs: trigger, rerun, read, list, cancel, artifacts — dbt Cloud's v2 paths over runplane's rules."""

from __future__ import annotations

import mimetypes
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from pydantic import AwareDatetime, BaseModel, Field

from api.cancelling import cancel_run
from api.lookup import existing_job, existing_run, run_artifact
from api.pull_requests import close_pull_request
from api.rerunning import rerun_from_failure, rerun_job, resume_from, retry_refusal
from api.rest import params, related, shapes
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rows import Run, RunWithEnvironment
from api.store import RunFilters, Store
from api.triggering import trigger_or_reattach
from api.validation import (
    MAX_CAUSE,
    RunOverridesSpec,
    TriggerSpec,
    checked_idempotency_key,
    checked_overrides,
    later_time,
    positive_id,
    text,
)
from runplane.adapters.db import Connection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound
from runplane.basics.types import AccountId, JobId, RunStatus, Trigger

router = APIRouter(responses=ERROR_RESPONSES)
MAX_LIMIT = 100
# dbt Cloud's artifact paths are rooted at target/; runplane keeps the path in the run's directory.
TARGET = "target/"
Id = Annotated[int, Field(ge=1, le=2**31 - 1)]
RUN_FILTERS = frozenset(
    {
        "include_related",
        "job_definition_id",
        "status",
        "status__in",
        "environment_id",
        "project_id",
        "project_id__in",
        "deferring_run_id",
        "pk",
        "pk__in",
        "id__gt",
        "state",
        "dbt_version",
        "dbt_version__in",
        "has_docs_generated",
        "has_sources_generated",
        "created_at__range",
        "finished_at__range",
    }
)
IdQuery = Annotated[int | None, Query(ge=1, le=2**63 - 1)]
IdsQuery = Annotated[str | None, Query(max_length=2000, description="Ids, e.g. [1,2] or 1,2.")]
RangeQuery = Annotated[
    str | None,
    Query(max_length=200, description="Two ISO 8601 date-times, start and end (both included): a,b or [a,b]."),
]


class TriggerRunplaneBody(BaseModel):
    """runplane's trigger options that dbt Cloud's body has no name for."""

    run_at: AwareDatetime | None = Field(
        None, description="A one-time run at this time (with its offset; up to a year ahead); null: now."
    )
    reattach: bool = Field(
        False,
        description="When a run of the job with the same overrides is queued or running, answer it "
        "(runplane.reattached true) instead of queuing another.",
    )


class TriggerRunBody(BaseModel):
    """dbt Cloud's trigger body; every override may be null (what its clients send when unset)."""

    cause: str = Field("Triggered via API", description="Why the run was triggered (shown on the run).")
    git_sha: str | None = None
    git_branch: str | None = None
    github_pull_request_id: Id | None = None
    gitlab_merge_request_id: Id | None = None
    azure_pull_request_id: Id | None = None
    schema_override: str | None = None
    dbt_version_override: str | None = None
    threads_override: int | None = None
    target_name_override: str | None = None
    generate_docs_override: bool | None = None
    timeout_seconds_override: int | None = None
    steps_override: list[str] | None = None
    runplane: TriggerRunplaneBody | None = None


# runplane's override names, as dbt Cloud's clients call them (for error messages).
_BODY_NAMES = {
    "steps": "steps_override",
    "threads": "threads_override",
    "schema": "schema_override",
    "timeout_seconds": "timeout_seconds_override",
    "target_name": "target_name_override",
    "dbt_version": "dbt_version_override",
    "pull_request_number": "github_pull_request_id",
}


def trigger_of(job_id: int, body: TriggerRunBody, idempotency_key: str | None = None) -> TriggerSpec:
    """The REST trigger as runplane's TriggerSpec, checked by the same rules as gRPC's."""
    prs = {
        name: value
        for name, value in (
            ("github", body.github_pull_request_id),
            ("gitlab", body.gitlab_merge_request_id),
            ("azure", body.azure_pull_request_id),
        )
        if value is not None
    }
    if len(prs) > 1:
        raise InvalidArgument("github_pull_request_id", "give at most one pull request id")
    provider, pull_request = next(iter(prs.items()), (None, None))
    overrides = checked_overrides(
        RunOverridesSpec(
            steps=body.steps_override,
            threads=body.threads_override,
            git_branch=body.git_branch,
            git_sha=body.git_sha,
            schema=body.schema_override,
            timeout_seconds=body.timeout_seconds_override,
            pull_request_number=pull_request,
            target_name=body.target_name_override,
            dbt_version=body.dbt_version_override,
            generate_docs=body.generate_docs_override,
            pull_request_provider=provider,
        ),
        lambda name: _BODY_NAMES.get(name, name),
    )
    cause = text(body.cause, "cause", max_length=MAX_CAUSE)
    key = checked_idempotency_key(idempotency_key, "Idempotency-Key")
    requested = body.runplane.run_at if body.runplane else None
    run_at = later_time(requested, "runplane.run_at") if requested is not None else None
    reattach = body.runplane.reattach if body.runplane else False
    return TriggerSpec(
        JobId(positive_id(job_id, "job_id")), Trigger.API, cause, key, overrides, run_at, reattach=reattach
    )


async def views(
    request: Request, store: Store, conn: Connection, rows: list[RunWithEnvironment], include: set[str]
) -> list[shapes.Run]:
    """Rows as dbt Cloud runs, with what ``include_related`` asked for (trigger, job, run_steps, debug_logs,
    environment, project, repository, run_retries, deferring_run; used_repo_cache and audit stay null)."""
    if not rows:
        return []
    account_id = rows[0].account_id
    ids: list[int] = [r.id for r in rows]
    want_steps = bool(include & {"run_steps", "debug_logs"})
    steps = await store.run_steps(conn, ids) if want_steps else {}
    logs = await store.step_logs(conn, ids) if want_steps else {}
    docs = await store.docs_of_runs(conn, ids)
    jobs: dict[int, shapes.Job] = {}
    if "job" in include:
        job_rows = [await store.get_job(conn, account_id, job_id) for job_id in {r.job_id for r in rows}]
        found = await related.jobs(store, conn, account_id, [j for j in job_rows if j is not None])
        jobs = {j.id: j.model_copy(update={"schedule": j.schedule.as_in_run()}) for j in found}
    where = (
        await related.places(store, conn, account_id) if include & {"environment", "project", "repository"} else None
    )
    retries: dict[int | None, list[shapes.Run]] = {}  # by parent run: retries_of_runs' rows all have one
    if "run_retries" in include:
        for retry in await store.retries_of_runs(conn, account_id, ids):
            retries.setdefault(retry.parent_run_id, []).append(shapes.run(retry, href=run_page(request, retry.id)))
    deferring: dict[int, shapes.Run] = {}
    if "deferring_run" in include:
        for deferred_id in {r.deferring_run_id for r in rows if r.deferring_run_id}:
            deferred = await store.get_run(conn, account_id, deferred_id)
            if deferred is not None:
                deferring[deferred_id] = shapes.run(deferred, href=run_page(request, deferred_id))
    return [
        shapes.run(
            row,
            href=run_page(request, row.id),
            docs=docs.get(row.id, set()),
            trigger_of=shapes.trigger(row) if "trigger" in include else None,
            job_of=jobs.get(row.job_id),
            environment_of=where.environment(row.environment_id) if where and "environment" in include else None,
            project_of=where.project(row.environment_id) if where and "project" in include else None,
            repository_of=where.repository(row.environment_id) if where and "repository" in include else None,
            steps=[
                shapes.step(row, s, logs.get((row.id, s.step_index), ""), debug_logs="debug_logs" in include)
                for s in steps.get(row.id, [])
            ],
            retries=retries.get(row.id),
            deferring=deferring.get(row.deferring_run_id) if row.deferring_run_id else None,
        )
        for row in rows
    ]


def run_page(request: Request, run_id: int) -> str:
    """The run's web page (served beside this API under ``/ui/``), where dbt Cloud's ``href`` points a person."""
    return f"{str(request.base_url).rstrip('/')}/ui/runs/{run_id}"


IncludeRelated = Annotated[
    list[str] | None,
    Query(
        description="Related objects to include: trigger, job, run_steps, debug_logs, environment, project, "
        "repository (comma-separated or repeated)."
    ),
]


JobPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the job")]
RunPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the run")]
Step = Annotated[
    int | None, Query(ge=1, le=10_000, description="1-based step whose artifacts to read (default: any step).")
]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def _one_run(request: Request, row: Run, include: set[str]) -> Envelope[shapes.Run]:
    store = _store(request)
    async with store.connection() as conn:
        # Read again with its job's environment, project and dbt version (a row just written has none).
        read = await existing_run(store, conn, row.account_id, row.id)
        (run,) = await views(request, store, conn, [read], include)
    return Envelope[shapes.Run](status=success(), data=run)


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/run/", summary="Trigger a job run")
async def trigger(
    request: Request,
    account_id: Account,
    job_id: JobPath,
    body: Annotated[TriggerRunBody | None, Body()] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="A retry with the same key returns the run the first trigger made and queues nothing; "
            "the same key with another job or body is 409. Keys are the account's.",
        ),
    ] = None,
) -> Envelope[shapes.Run]:
    spec = trigger_of(job_id, body or TriggerRunBody(), idempotency_key)
    params.dbt_versions(request).check(spec.overrides.dbt_version, "dbt_version_override")
    triggered = await trigger_or_reattach(_store(request), request.app.state.pickups, account_id, spec)
    answer = await _one_run(request, triggered.run, {"trigger", "job"})
    answer.data.reattached = triggered.reattached
    return answer


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="A retry with the same key returns the run the first request made and queues nothing. "
        "Keys are the account's.",
    ),
]


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/rerun/", summary="Rerun the job's latest run")
async def rerun(
    request: Request, account_id: Account, job_id: JobPath, idempotency_key: IdempotencyKey = None
) -> Envelope[shapes.Run]:
    """After an error, the latest run again from its failed step (as ``.../runs/{id}/retry/``); else a new run."""
    key = checked_idempotency_key(idempotency_key, "Idempotency-Key")
    row = await rerun_job(_store(request), request.app.state.pickups, account_id, job_id, key)
    return await _one_run(request, row, {"trigger", "job"})


@router.post("/api/v2/accounts/{account_id}/runs/{run_id}/retry/", summary="Rerun a failed run from its failure")
async def retry(request: Request, account_id: Account, run_id: RunPath) -> Envelope[shapes.Run]:
    """A new run that resumes the failed run from its failed step (``dbt retry`` where dbt can)."""
    row = await rerun_from_failure(_store(request), request.app.state.pickups, account_id, run_id)
    return await _one_run(request, row, {"trigger", "job"})


class ClosePullRequestBody(BaseModel):
    job_id: int | None = Field(None, ge=1, le=2**63 - 1, description="Only this CI job (default: every one).")


@router.post(
    "/api/v2/accounts/{account_id}/pull-requests/{pull_request_number}/close/",
    summary="Close a pull request: drop its schemas",
)
async def close_pull_request_(
    request: Request,
    account_id: Account,
    pull_request_number: Annotated[int, Path(ge=1, le=2**31 - 1)],
    body: Annotated[ClosePullRequestBody | None, Body()] = None,
) -> Envelope[list[shapes.Run]]:
    """A run per CI job that built a schema for the pull request drops it; its CI runs still in progress stop."""
    job_id = body.job_id if body is not None else None
    rows = await close_pull_request(
        _store(request),
        request.app.state.pickups,
        account_id,
        pull_request_number,
        job_ids=[] if job_id is None else [job_id],
        why=f"pull request #{pull_request_number} was closed",
    )
    store = _store(request)
    async with store.connection() as conn:
        runs = await views(request, store, conn, rows, {"trigger"})
    return Envelope[list[shapes.Run]](status=success(), data=runs)


@router.get("/api/v2/accounts/{account_id}/runs/{run_id}/", summary="Get a run")
async def get_run(
    request: Request, account_id: Account, run_id: RunPath, include_related: IncludeRelated = None
) -> Envelope[shapes.Run]:
    store = _store(request)
    async with store.connection() as conn:
        row = await existing_run(store, conn, account_id, run_id)
        (run,) = await views(request, store, conn, [row], params.related(include_related))
    return Envelope[shapes.Run](status=success(), data=run)


@router.get("/api/v2/accounts/{account_id}/runs/", summary="List runs")
async def list_runs(
    request: Request,
    account_id: Account,
    *,
    include_related: IncludeRelated = None,
    job_definition_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    status: Annotated[int | None, Query(description="One run status code (1, 2, 3, 10, 20, 30).")] = None,
    status__in: Annotated[str | None, Query(max_length=200, description="Status codes, e.g. [10,20].")] = None,
    environment_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    project_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    project_id__in: Annotated[str | None, Query(max_length=2000, description="Project ids, e.g. [1,2].")] = None,
    deferring_run_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    pk: IdQuery = None,
    pk__in: IdsQuery = None,
    id__gt: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    state: Annotated[
        str | None, Query(max_length=10, description="all (default), active (1) or deleted (2): none is kept deleted.")
    ] = None,
    dbt_version: Annotated[str | None, Query(max_length=128, pattern=params.PLAIN_TEXT)] = None,
    dbt_version__in: Annotated[str | None, Query(max_length=2000, description='e.g. ["1.9", "1.10"]')] = None,
    has_docs_generated: bool | None = None,
    has_sources_generated: bool | None = None,
    created_at__range: RangeQuery = None,
    finished_at__range: RangeQuery = None,
    order_by: Annotated[
        str | None,
        Query(max_length=40, description="id, created_at, finished_at, ...; -x for descending (default -id)."),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
) -> ListEnvelope[shapes.Run]:
    """Newest first unless ``order_by`` says otherwise, as dbt Cloud lists them."""
    params.only_known(request.query_params, RUN_FILTERS)
    store = _store(request)
    wanted = params.statuses(status, status__in)
    order = params.order_by(order_by, params.RUN_ORDERS, default="-id")
    project_ids = params.ids(project_id__in, "project_id__in") + ((project_id,) if project_id is not None else ())
    run_ids = params.ids(pk__in, "pk__in") + ((pk,) if pk is not None else ())
    versions = params.texts(dbt_version__in, "dbt_version__in") + ((dbt_version,) if dbt_version is not None else ())
    which = params.state(state, params.State.ALL)
    include = params.related(include_related)
    filters = RunFilters(
        job_id=job_definition_id,
        statuses=tuple(wanted),
        environment_id=environment_id,
        project_ids=project_ids,
        deferring_run_id=deferring_run_id,
        run_ids=run_ids,
        id_gt=id__gt,
        dbt_versions=versions,
        has_docs=has_docs_generated,
        has_sources=has_sources_generated,
        created=params.date_range(created_at__range, "created_at__range"),
        finished=params.date_range(finished_at__range, "finished_at__range"),
    )
    echoed: dict[str, object] = {
        "job_definition_id": job_definition_id,
        "status__in": [int(s) for s in wanted],
        "environment_id": environment_id,
        "project_id": project_id,
        "project_id__in": list(project_ids) if project_id__in is not None else None,
        "deferring_run_id": deferring_run_id,
        "pk__in": list(run_ids) or None,
        "id__gt": id__gt,
        "state": which.value,
        "dbt_version__in": list(versions) or None,
        "has_docs_generated": has_docs_generated,
        "has_sources_generated": has_sources_generated,
        "created_at__range": [str(t) for t in filters.created] if filters.created else None,
        "finished_at__range": [str(t) for t in filters.finished] if filters.finished else None,
    }
    rows: list[RunWithEnvironment] = []
    total = 0
    async with store.connection() as conn:
        if which is not params.State.DELETED:  # runplane keeps no deleted run: a run is kept or removed
            rows, total = await store.runs_by_offset(
                conn, account_id, filters, order_by=order, offset=offset, limit=limit
            )
        runs = await views(request, store, conn, rows, include)
    return ListEnvelope[shapes.Run](
        status=success(),
        data=runs,
        extra=Extra(
            filters={**{k: v for k, v in echoed.items() if v is not None}, "limit": limit, "offset": offset},
            order_by=order,
            pagination=Pagination(count=len(runs), total_count=total),
        ),
    )


@router.post("/api/v2/accounts/{account_id}/runs/{run_id}/cancel/", summary="Cancel a run")
async def cancel(request: Request, account_id: Account, run_id: RunPath) -> Envelope[shapes.Run]:
    row = await cancel_run(_store(request), account_id, run_id)
    return await _one_run(request, row, {"trigger"})


@router.get("/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/", summary="List a run's artifacts")
async def list_artifacts(
    request: Request, account_id: Account, run_id: RunPath, step: Step = None
) -> Envelope[list[str]]:
    store = _store(request)
    async with store.connection() as conn:
        run = (await existing_run(store, conn, account_id, run_id)).id
        rows = await store.artifacts_of_step(conn, run, None if step is None else step - 1)
    return Envelope[list[str]](status=success(), data=[r.path.removeprefix(TARGET) for r in rows])


@router.get(
    "/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/{path:path}",
    summary="Get a run's artifact",
    response_class=Response,
    responses={200: {"content": {"application/json": {}, "text/plain": {}, "application/octet-stream": {}}}},
)
async def get_artifact(
    request: Request,
    account_id: Account,
    run_id: RunPath,
    path: Annotated[str, Path(description="Path under target/, e.g. manifest.json")],
    step: Step = None,
) -> Response:
    return await _artifact(_store(request), account_id, run_id, path, step)


async def _artifact(store: Store, account_id: AccountId, run_id: int, path: str, step: int | None) -> Response:
    """A run's file: under target/ (dbt Cloud's paths are rooted there), else as kept."""
    step_index = None if step is None else step - 1
    async with store.connection() as conn:
        try:
            row = await run_artifact(store, conn, account_id, run_id, TARGET + path, step_index=step_index)
        except NotFound:
            row = await run_artifact(store, conn, account_id, run_id, path, step_index=step_index)
    media_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return Response(bytes(row.content), media_type=media_type)


@router.get(
    "/api/v2/accounts/{account_id}/jobs/{job_id}/artifacts/{path:path}",
    summary="Get an artifact of the job's latest successful run",
    response_class=Response,
    responses={200: {"content": {"application/json": {}, "text/plain": {}, "application/octet-stream": {}}}},
)
async def get_job_artifact(
    request: Request,
    account_id: Account,
    job_id: JobPath,
    path: Annotated[str, Path(description="Path under target/, e.g. manifest.json")],
    step: Step = None,
) -> Response:
    """The file of the job's most recent successful run (404 when it has none, or that run kept no such file)."""
    store = _store(request)
    async with store.connection() as conn:
        await existing_job(store, conn, account_id, job_id)
        latest, _ = await store.runs_by_offset(
            conn,
            account_id,
            RunFilters(job_id=job_id, statuses=(RunStatus.SUCCESS,)),
            order_by="-id",
            offset=0,
            limit=1,
        )
    if not latest:
        raise NotFound(f"job {job_id} has no successful run")
    return await _artifact(store, account_id, latest[0].id, path, step)


class FailureDetails(BaseModel):
    """dbt Cloud's details of a failed run a retry would resume: the step it starts from, the ones after."""

    failed_step: str | None
    skipped_steps: list[str]


@router.get("/api/v2/accounts/{account_id}/runs/{run_id}/retry/", summary="What a retry of the run would rerun")
async def retry_details(request: Request, account_id: Account, run_id: RunPath) -> Envelope[FailureDetails]:
    """409 for a run that did not fail (its ``retry_not_supported_reason`` says so)."""
    store = _store(request)
    async with store.connection() as conn:
        run = await existing_run(store, conn, account_id, run_id)
        steps = (await store.run_steps(conn, [run_id]))[run_id]
    reason = retry_refusal(run)
    if reason is not None:
        raise FailedPrecondition(f"run {run_id} cannot be retried: {reason}")
    start = resume_from(steps)
    names = [shapes.step(run, s, "", debug_logs=False).name for s in steps if not s.setup and s.step_index >= start]
    details = FailureDetails(failed_step=names[0] if names else None, skipped_steps=names[1:])
    return Envelope[FailureDetails](status=success(), data=details)


@router.get("/api/v2/accounts/{account_id}/steps/{step_id}/", summary="Get a run step")
async def get_step(
    request: Request,
    account_id: Account,
    step_id: Annotated[int, Path(ge=1, le=2**63 - 1, description="The step's id, as a run's run_steps show it")],
    include_related: IncludeRelated = None,
) -> Envelope[shapes.RunStep]:
    run_id, index = divmod(step_id - 1, shapes.STEPS_PER_RUN)
    include = params.related(include_related)
    store = _store(request)
    async with store.connection() as conn:
        run = await store.get_run(conn, account_id, run_id) if run_id else None
        steps = (await store.run_steps(conn, [run_id]))[run_id] if run is not None else []
        found = next((s for s in steps if s.step_index == index), None)
        if run is None or found is None:
            raise NotFound(f"step {step_id} not found")
        logs = (await store.step_logs(conn, [run_id])).get((run_id, index), "")
    return Envelope[shapes.RunStep](
        status=success(), data=shapes.step(run, found, logs, debug_logs="debug_logs" in include)
    )
