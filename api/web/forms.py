"""The forms that make and change jobs, projects and environments.

A form becomes the same request the gRPC API takes and is checked and saved by the same use cases
(``api.validation``, ``api.projects_validation``, ``api.job_definitions``,
``api.project_definitions``). A job's completion triggers are rows of its form: one per trigger and
an empty one to add another. What the checks refuse comes back on the form, next to its field (a
completion trigger's at its row), with what was typed; secrets are write-only: never shown, kept
when left empty.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from starlette.datastructures import FormData

from api.job_definitions import create_job, update_job
from api.lookup import existing_job
from api.project_definitions import create_environment, create_project, update_environment, update_project
from api.projects_validation import environment_spec
from api.rows import CompletionTrigger, Environment, Job, Project
from api.store import Store
from api.validation import MAX_COMPLETION_TRIGGERS, JobSpec, checked_idempotency_key, job_spec
from api.web.conflicts import LOADED_FIELD, changed_since, conflict_errors, loaded_values
from api.web.form_fields import (
    FormErrors,
    checked_number,
    connection_inputs,
    lines,
    number,
    secret_lines,
    variables,
    without_secret_lines,
)
from api.web.layout import dbt_versions_of, page, see_other, store_of, warehouses_of
from api.web.session import CSRF_FIELD, Changing, Looking, Viewer
from runplane.basics.errors import (
    FailedPrecondition,
    InvalidArgument,
    InvalidArguments,
    NotFound,
    Problems,
    VersionConflict,
)
from runplane.basics.overlap import OVERLAP_TO_PROTO, OVERLAP_WORDS, OverlapPolicy
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.secrets import SecretBox
from runplane.basics.types import JOB_TYPE_TO_PROTO, AccountId, JobId, JobType, RunStatus
from runplane.dbt.connections import ADAPTERS, AdapterFields, adapter_fields
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles
from runplane.v1 import common_pb2, jobs_pb2, projects_pb2

router = APIRouter(prefix="/ui", include_in_schema=False)

JOB_FIELDS = {
    "name", "job_type", "environment_id", "steps", "cron", "timezone", "on_pull_request", "on_merge",
    "threads", "timeout_seconds", "target_name", "schema", "git_branch", "generate_docs",
    "run_source_freshness", "defer_to_job_id", "run_only_modified", "retry_max_attempts", "environment",
    "defer_to_environment_id", "retry_on_step_failure", "upstream_job_id", "priority", "missed_run_grace_seconds",
    "completion_mode", "overlap_policy", "jitter_seconds", "catchup_window_seconds", "catchup_all",
    *(f"upstream_job_id_{i}" for i in range(1, MAX_COMPLETION_TRIGGERS)),
}  # fmt: skip
PROJECT_FIELDS = {"name", "repository_url", "subdirectory", "git_credential_kind", "git_credential"}
ADAPTER = "postgres"  # a new environment's warehouse until another is chosen
ENVIRONMENT_FIELDS = {
    "name", "environment_type", "dbt_version", "git_branch", "adapter_type", "target_name", "schema",
    "threads", "variables", "clear_secret_fields", "project_id",
    *(f"conn_{f}" for a in ADAPTERS.values() for f in a.strings | a.integers | a.booleans | a.secrets),
}  # fmt: skip
CONNECTION_SECRETS = sorted({s for a in ADAPTERS.values() for s in a.secrets})
VARIABLES_FIELDS = {"environment", "variables"}  # NAME=value text areas of the job and the environment forms
SECRET_FIELDS = {
    "git_credential": "the token or private key",
    **{f"conn_{s}": f"the {s.replace('_', ' ')}" for a in ADAPTERS.values() for s in a.secrets},
}  # write-only
CREDENTIAL_KINDS = {
    "none": projects_pb2.GIT_CREDENTIAL_KIND_UNSPECIFIED,
    "token": projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
    "ssh_key": projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY,
}
ENVIRONMENT_TYPES = {
    "deployment": projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
    "development": projects_pb2.ENVIRONMENT_TYPE_DEVELOPMENT,
}


def _repositories(request: Request) -> RepositoryRule:
    rule: RepositoryRule = request.app.state.repositories
    return rule


def _box(request: Request) -> SecretBox:
    box: SecretBox | None = request.app.state.box
    if box is None:
        raise FailedPrecondition("secrets cannot be stored: this server has no RUNPLANE_SECRET_KEYS")
    return box


def _choice(form: FormData, name: str, allowed: dict[str, Any], problems: Problems) -> Any:
    """The option chosen; one not offered is kept in ``problems`` (and the first option used)."""
    value = str(form.get(name, ""))
    if value not in allowed:
        problems.found.append(InvalidArgument(name, f"choose one of {', '.join(allowed)}"))
        return next(iter(allowed.values()))
    return allowed[value]


def _text(form: FormData, name: str) -> str:
    return str(form.get(name, ""))


def _checked(form: FormData, name: str) -> bool:
    return name in form


def _id(form: FormData, name: str, problems: Problems) -> int:
    """A select of ids; empty for none (0, as the API's requests say)."""
    return checked_number(_text(form, name), name, problems)


def _version(form: FormData) -> int:
    """The version an edit form was read at (0 from a form without one: no check)."""
    return number(_text(form, "version"), "version") or 0


# The API's name of a field where the form's differs: triggers.schedule is the cron field, the completion
# trigger's statuses and loops are told at its upstream job.
FIELD_ALIASES = {"schedule": "cron", "statuses": "upstream_job_id", "on_completion": "upstream_job_id"}


async def _refused(
    request: Request, who: Viewer, template: str, exc: InvalidArgument, known: set[str], **context: Any
) -> HTMLResponse:
    """The form again, with what was typed and the error next to its field (secrets are not echoed)."""
    errors = FormErrors.of(exc, known, FIELD_ALIASES)
    return await _again(request, who, template, errors, status=400, overrides={}, **context)


async def _conflicted(
    request: Request,
    who: Viewer,
    template: str,
    exc: VersionConflict,
    *,
    known: set[str],
    now: dict[str, str],
    **context: Any,
) -> HTMLResponse:
    """The form again after someone else's save came first: what they changed named at its fields,
    what this person typed kept, and the version stored now, so that saving again applies it."""
    form = await request.form()
    errors = conflict_errors(exc, changed_since(_text(form, LOADED_FIELD), now), known)
    current = {"version": now["version"], LOADED_FIELD: loaded_values(now)}
    return await _again(request, who, template, errors, status=409, overrides=current, **context)


async def _again(
    request: Request,
    who: Viewer,
    template: str,
    errors: FormErrors,
    *,
    status: int,
    overrides: dict[str, str],
    **context: Any,
) -> HTMLResponse:
    """A refused form shown again with what was typed, but its secrets: those are never sent back, and
    the form says which ones must be typed again."""
    form = await request.form()
    values = {k: str(v) for k, v in form.items() if k not in {*SECRET_FIELDS, CSRF_FIELD}}
    for name in VARIABLES_FIELDS & set(values):
        values[name] = without_secret_lines(values[name])
    errors.general.extend(_secrets_to_type_again(form))
    answer = await page(request, template, who, values=values | overrides, errors=errors, **context)
    answer.status_code = status
    return answer


def _secrets_to_type_again(form: FormData) -> list[str]:
    """What a refused form had in its secret fields, named (never shown): it was not kept."""
    said = [
        f"Nothing was kept of {what} you typed: type it again."
        for name, what in SECRET_FIELDS.items()
        if _text(form, name).strip()
    ]
    for name in sorted(VARIABLES_FIELDS & set(form)):
        typed = secret_lines(_text(form, name))
        if typed:
            said.append(f"The secret variables you typed ({', '.join(typed)}) were not kept: type them again.")
    return said


def _with_loaded(values: dict[str, str]) -> dict[str, str]:
    """An edit form's values with what it was loaded with, to name another save's change at a conflict."""
    return {**values, LOADED_FIELD: loaded_values(values)}


# -- jobs -----------------------------------------------------------------------------------------


def _job_values(job: Job | None, completion: list[CompletionTrigger]) -> dict[str, str]:
    if job is None:
        return {
            "job_type": "deploy", "timezone": "UTC", "create_key": uuid.uuid4().hex, "upstream_success": "on",
            "completion_mode": "any",
        }  # fmt: skip
    flags = {
        "on_pull_request": job.on_pull_request, "on_merge": job.on_merge, "generate_docs": job.generate_docs,
        "run_source_freshness": job.run_source_freshness, "run_only_modified": job.run_only_modified,
        "retry_on_step_failure": job.retry_on_step_failure, "catchup_all": job.catchup_all,
    }  # fmt: skip
    upstream = {f"upstream_success{_row(len(completion))}": "on"}  # the row to add one, success ticked
    for i, trigger in enumerate(completion):
        upstream[f"upstream_job_id{_row(i)}"] = str(trigger.upstream_job_id)
        upstream |= {f"upstream_{RunStatus(s).name.lower()}{_row(i)}": "on" for s in trigger.statuses}
    return _with_loaded(
        {
            **upstream,
            "defer_to_environment_id": str(job.defer_to_environment_id or ""),
            "name": job.name,
            "job_type": job.job_type,
            "environment_id": str(job.environment_id or ""),
            "steps": "\n".join(job.steps),
            "cron": job.cron or "",
            "timezone": job.timezone or "UTC",
            "threads": str(job.threads or ""),
            "timeout_seconds": str(job.timeout_seconds or ""),
            "target_name": job.target_name,
            "schema": job.schema_name,
            "git_branch": job.git_branch,
            "defer_to_job_id": str(job.defer_to_job_id or ""),
            "retry_max_attempts": str(job.retry_max_attempts or ""),
            "priority": str(job.priority or ""),
            "missed_run_grace_seconds": str(job.missed_run_grace_seconds),
            "completion_mode": job.completion_mode,
            "overlap_policy": job.overlap_policy,
            "jitter_seconds": str(job.jitter_seconds or ""),
            "catchup_window_seconds": str(job.catchup_window_seconds or ""),
            "environment": "\n".join(f"{k}={v}" for k, v in sorted(job.environment.items())),
            "version": str(job.version),
            **{name: "on" for name, ticked in flags.items() if ticked},
        }
    )


JOB_TYPES = {t.value: JOB_TYPE_TO_PROTO[t] for t in JobType}
COMPLETION_MODES = {"any": jobs_pb2.COMPLETION_MODE_ANY, "all": jobs_pb2.COMPLETION_MODE_ALL}
OVERLAP_POLICIES = {policy.value: OVERLAP_TO_PROTO[policy] for policy in OverlapPolicy}
UPSTREAM_STATUSES = (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.CANCELLED)
_ON_COMPLETION = re.compile(r"triggers\.on_completion\[(\d+)\]")


def _row(i: int) -> str:
    """The suffix of a completion trigger row's fields: none for the first (``upstream_job_id``), then
    ``_1``, ``_2``..."""
    return f"_{i}" if i else ""


def _upstream_rows(form: FormData) -> list[int]:
    """The completion trigger rows that name a job, in order: the API's ``on_completion`` list."""
    return [i for i in range(MAX_COMPLETION_TRIGGERS) if _text(form, f"upstream_job_id{_row(i)}").strip()]


def _at_its_row(exc: InvalidArgument, form: FormData) -> InvalidArgument:
    """An error about the k-th completion trigger, put at the job select of the form's row it came from."""
    if isinstance(exc, InvalidArguments):
        return InvalidArguments([_at_its_row(problem, form) for problem in exc.problems])
    found = _ON_COMPLETION.match(exc.field)
    if found is None:
        return exc
    rows = _upstream_rows(form)
    k = int(found.group(1))
    row = rows[k] if k < len(rows) else 0
    return InvalidArgument(f"upstream_job_id{_row(row)}", str(exc).removeprefix(f"{exc.field}: "))


def _job_definition(
    form: FormData, stored: Job | None, completion: list[CompletionTrigger], problems: Problems
) -> jobs_pb2.Job:
    """The job the form describes; what it does not show is kept from ``stored`` (None: a new job). What
    the form cannot even read (a number that is not one) is kept in ``problems``."""
    job = jobs_pb2.Job()
    s, t = job.settings, job.triggers
    # A page loaded before the form had these fields posts none of them: the stored values stay.
    if stored is not None and not {"priority", "missed_run_grace_seconds", "completion_mode"} & set(form):
        s.missed_run_grace_seconds = stored.missed_run_grace_seconds
        s.priority = stored.priority
        t.completion_mode = COMPLETION_MODES[stored.completion_mode]
    else:
        grace_typed = _text(form, "missed_run_grace_seconds")
        grace = problems.check(lambda: number(grace_typed, "missed_run_grace_seconds"), None)
        s.missed_run_grace_seconds = -1 if grace is None else grace  # empty: the default, as the API's -1
        s.priority = checked_number(_text(form, "priority"), "priority", problems)
        if "completion_mode" in form:
            t.completion_mode = _choice(form, "completion_mode", COMPLETION_MODES, problems)
    # Likewise a page from before the overlap policy and jitter fields (a new job: the defaults).
    if "overlap_policy" not in form:
        if stored is not None:
            s.overlap_policy = OVERLAP_TO_PROTO[OverlapPolicy(stored.overlap_policy)]
            s.jitter_seconds = stored.jitter_seconds
    else:
        s.overlap_policy = _choice(form, "overlap_policy", OVERLAP_POLICIES, problems)
        s.jitter_seconds = checked_number(_text(form, "jitter_seconds"), "jitter_seconds", problems)
    # And a page from before the catch-up fields.
    if "catchup_window_seconds" not in form:
        if stored is not None:
            s.catchup_window_seconds = stored.catchup_window_seconds
            s.catchup_all = stored.catchup_all
    else:
        window = _text(form, "catchup_window_seconds")
        s.catchup_window_seconds = checked_number(window, "catchup_window_seconds", problems)
        s.catchup_all = _checked(form, "catchup_all")
    if stored is not None and "upstream_job_id" not in form:  # a page from before the rows: kept as stored
        t.on_completion.extend(
            jobs_pb2.CompletionTrigger(
                upstream_job_id=c.upstream_job_id, statuses=[common_pb2.RunStatus.ValueType(s) for s in c.statuses]
            )
            for c in completion
        )
    for i in _upstream_rows(form):
        trigger = t.on_completion.add(upstream_job_id=_id(form, f"upstream_job_id{_row(i)}", problems))
        trigger.statuses.extend(
            common_pb2.RunStatus.ValueType(s)
            for s in UPSTREAM_STATUSES
            if _checked(form, f"upstream_{s.name.lower()}{_row(i)}")
        )
    job.name = _text(form, "name")
    job.job_type = _choice(form, "job_type", JOB_TYPES, problems)
    job.steps.extend(lines(_text(form, "steps")) or [])
    cron = _text(form, "cron").strip()
    if cron:
        t.schedule.CopyFrom(jobs_pb2.CronSchedule(cron=cron, timezone=_text(form, "timezone").strip()))
    t.on_pull_request = _checked(form, "on_pull_request")
    t.on_merge = _checked(form, "on_merge")
    s.environment_id = _id(form, "environment_id", problems)
    s.threads = checked_number(_text(form, "threads"), "threads", problems)
    s.timeout_seconds = checked_number(_text(form, "timeout_seconds"), "timeout_seconds", problems)
    s.retry_max_attempts = checked_number(_text(form, "retry_max_attempts"), "retry_max_attempts", problems)
    s.target_name = _text(form, "target_name").strip()
    s.schema = _text(form, "schema").strip()
    s.git_branch = _text(form, "git_branch").strip()
    s.generate_docs = _checked(form, "generate_docs")
    s.run_source_freshness = _checked(form, "run_source_freshness")
    s.defer_to_job_id = _id(form, "defer_to_job_id", problems)
    s.run_only_modified = _checked(form, "run_only_modified")
    s.defer_to_environment_id = _id(form, "defer_to_environment_id", problems)
    s.retry_on_step_failure = _checked(form, "retry_on_step_failure")
    # Plain variables as the form lists them; a secret (DBT_ENV_SECRET_*) not named is kept.
    s.environment.update(problems.check(lambda: variables(_text(form, "environment"), "environment"), dict[str, str]()))
    return job


def _checked_job(
    form: FormData, stored: Job | None, completion: list[CompletionTrigger], job_id: int | None
) -> JobSpec:
    """The job the form describes as the API checks it; what the form cannot read and what the checks
    refuse are named together, every field at once."""
    problems = Problems()
    definition = _job_definition(form, stored, completion, problems)
    fields: dict[str, Any] = {
        "name": definition.name,
        "job_type": definition.job_type,
        "steps": definition.steps,
        "triggers": definition.triggers,
        "settings": definition.settings,
    }
    asked = jobs_pb2.UpdateJobRequest(job_id=job_id, **fields) if job_id else jobs_pb2.CreateJobRequest(**fields)
    spec = problems.check(lambda: job_spec(asked), None)
    problems.raise_any()
    assert spec is not None
    return spec


async def _job_choices(store: Store, account_id: AccountId, job_id: int | None = None) -> dict[str, Any]:
    """The environments a job may run in and the jobs it may defer to, as a select's options."""
    async with store.connection() as conn:
        environments = await store.list_environments(conn, account_id, None)
        jobs = await store.job_names(conn, account_id)
    return {
        "environment_options": [("", "none: plain commands")] + [(str(e.id), e.name) for e in environments],
        "defer_environment_options": [("", "no environment")] + [(str(e.id), e.name) for e in environments],
        "defer_options": [("", "no job")] + [(str(j.id), j.name) for j in jobs if j.id != job_id],
        "upstream_options": [("", "no job")] + [(str(j.id), j.name) for j in jobs if j.id != job_id],
        "upstream_statuses": [s.name.lower() for s in UPSTREAM_STATUSES],
        "upstream_rows": MAX_COMPLETION_TRIGGERS,
        "overlap_options": [(p.value, f"{p.value}: {OVERLAP_WORDS[p]}") for p in OverlapPolicy],
    }


async def _stored_job(store: Store, account_id: AccountId, job_id: int) -> tuple[Job, list[CompletionTrigger]]:
    """The job as stored, with its completion triggers."""
    async with store.connection() as conn:
        row = await existing_job(store, conn, account_id, job_id)
        triggers = await store.completion_triggers(conn, [row.id])
    return row, triggers[row.id]


@router.get("/jobs/new", response_class=HTMLResponse)
async def new_job(request: Request, who: Looking) -> HTMLResponse:
    choices = await _job_choices(store_of(request), who.account_id)
    return await page(
        request, "job_form.html", who, job=None, values=_job_values(None, []), errors=FormErrors(), **choices
    )


@router.post("/jobs/new", response_model=None)
async def create_job_form(request: Request, who: Changing) -> Response:
    form = await request.form()
    store = store_of(request)
    try:
        spec = _checked_job(form, None, [], None)
        key = checked_idempotency_key(_text(form, "create_key"), "create_key")
        row = await create_job(store, who.account_id, spec, create_key=key and f"web:{key}")
    except InvalidArgument as exc:
        choices = await _job_choices(store, who.account_id)
        return await _refused(request, who, "job_form.html", _at_its_row(exc, form), JOB_FIELDS, job=None, **choices)
    return see_other(f"/ui/jobs/{row.id}")


@router.get("/jobs/{job_id}/edit", response_class=HTMLResponse)
async def edit_job(request: Request, who: Looking, job_id: int) -> HTMLResponse:
    store = store_of(request)
    job, completion = await _stored_job(store, who.account_id, job_id)
    choices = await _job_choices(store, who.account_id, job_id)
    values = _job_values(job, completion)
    return await page(request, "job_form.html", who, job=job, values=values, errors=FormErrors(), **choices)


@router.post("/jobs/{job_id}/edit", response_model=None)
async def update_job_form(request: Request, who: Changing, job_id: int) -> Response:
    form = await request.form()
    store = store_of(request)
    stored, completion = await _stored_job(store, who.account_id, job_id)
    try:
        spec = _checked_job(form, stored, completion, job_id)
        expected = _version(form)
        await update_job(store, who.account_id, JobId(job_id), spec, expected_version=expected)
    except InvalidArgument as exc:
        choices = await _job_choices(store, who.account_id, job_id)
        return await _refused(request, who, "job_form.html", _at_its_row(exc, form), JOB_FIELDS, job=stored, **choices)
    except VersionConflict as exc:
        now, completion = await _stored_job(store, who.account_id, job_id)
        choices = await _job_choices(store, who.account_id, job_id)
        values = _job_values(now, completion)
        return await _conflicted(request, who, "job_form.html", exc, known=JOB_FIELDS, now=values, job=now, **choices)
    return see_other(f"/ui/jobs/{job_id}")


# -- projects and environments --------------------------------------------------------------------


@router.get("/projects", response_class=HTMLResponse)
async def projects(request: Request, who: Looking) -> HTMLResponse:
    store = store_of(request)
    async with store.connection() as conn:
        rows = await store.list_projects(conn, who.account_id)
        environments = await store.list_environments(conn, who.account_id, None)
    by_project: dict[int, list[Environment]] = {r.id: [] for r in rows}
    for environment in environments:
        by_project.setdefault(environment.project_id, []).append(environment)
    return await page(request, "projects.html", who, projects=[(r, by_project[r.id]) for r in rows])


async def _project(store: Store, account_id: AccountId, project_id: int) -> Project:
    async with store.connection() as conn:
        row = await store.get_project(conn, account_id, project_id)
    if row is None:
        raise NotFound(f"project {project_id} not found")
    return row


def _project_values(row: Project | None) -> dict[str, str]:
    if row is None:
        return {"git_credential_kind": "none"}
    return _with_loaded(
        {
            "name": row.name,
            "repository_url": row.repository_url,
            "subdirectory": row.subdirectory,
            "git_credential_kind": row.git_credential_kind,
            "version": str(row.version),
        }
    )


def _project_request(form: FormData, problems: Problems) -> dict[str, Any]:
    return {
        "name": _text(form, "name"),
        "repository_url": _text(form, "repository_url"),
        "subdirectory": _text(form, "subdirectory"),
        "git_credential_kind": _choice(form, "git_credential_kind", CREDENTIAL_KINDS, problems),
        "git_credential": _text(form, "git_credential").strip(),
    }


@router.get("/projects/new", response_class=HTMLResponse)
async def new_project(request: Request, who: Looking) -> HTMLResponse:
    return await page(
        request, "project_form.html", who, project=None, values=_project_values(None), errors=FormErrors()
    )


@router.post("/projects/new", response_model=None)
async def create_project_form(request: Request, who: Changing) -> Response:
    form = await request.form()
    try:
        problems = Problems()
        message = projects_pb2.CreateProjectRequest(**_project_request(form, problems))
        problems.raise_any()
        row = await create_project(
            store_of(request), lambda: _box(request), _repositories(request), who.account_id, message
        )
    except InvalidArgument as exc:
        return await _refused(request, who, "project_form.html", exc, PROJECT_FIELDS, project=None)
    return see_other(f"/ui/projects#project-{row.id}")


@router.get("/projects/{project_id}/edit", response_class=HTMLResponse)
async def edit_project(request: Request, who: Looking, project_id: int) -> HTMLResponse:
    row = await _project(store_of(request), who.account_id, project_id)
    return await page(request, "project_form.html", who, project=row, values=_project_values(row), errors=FormErrors())


@router.post("/projects/{project_id}/edit", response_model=None)
async def update_project_form(request: Request, who: Changing, project_id: int) -> Response:
    form = await request.form()
    store = store_of(request)
    row = await _project(store, who.account_id, project_id)
    try:
        problems = Problems()
        message = projects_pb2.UpdateProjectRequest(
            project_id=project_id, expected_version=_version(form), **_project_request(form, problems)
        )
        problems.raise_any()
        await update_project(store, lambda: _box(request), _repositories(request), who.account_id, message)
    except InvalidArgument as exc:
        return await _refused(request, who, "project_form.html", exc, PROJECT_FIELDS, project=row)
    except VersionConflict as exc:
        now = await _project(store, who.account_id, project_id)
        values = _project_values(now)
        return await _conflicted(request, who, "project_form.html", exc, known=PROJECT_FIELDS, now=values, project=now)
    return see_other(f"/ui/projects#project-{project_id}")


def _environment_values(row: Environment | None, adapter: str = ADAPTER) -> dict[str, str]:
    if row is None:
        defaults = {"environment_type": "deployment", "target_name": "default", "threads": "4", "adapter_type": adapter}
        port = adapter_fields(adapter).profile_defaults.get("port")
        return defaults | ({"conn_port": str(port)} if port else {})
    values = {
        "adapter_type": row.adapter_type,
        "name": row.name,
        "environment_type": row.environment_type,
        "dbt_version": row.dbt_version,
        "git_branch": row.git_branch,
        "target_name": row.target_name,
        "schema": row.schema_name,
        "threads": str(row.threads),
        "variables": "\n".join(f"{k}={v}" for k, v in sorted(row.variables.items())),
    }
    values.update({f"conn_{k}": str(v) for k, v in row.connection.items()})
    return _with_loaded(values | {"version": str(row.version)})


def _form_adapter(form: FormData, problems: Problems) -> tuple[str, AdapterFields]:
    """The warehouse the form was made for; one not offered is kept in ``problems`` (Postgres used)."""
    name = _text(form, "adapter_type") or ADAPTER
    if name not in ADAPTERS:
        problems.found.append(InvalidArgument("adapter_type", f"choose one of {', '.join(sorted(ADAPTERS))}"))
        name = ADAPTER
    return name, ADAPTERS[name]


def _environment_request(form: FormData, problems: Problems) -> dict[str, Any]:
    adapter, schema = _form_adapter(form, problems)
    typed = {f: _text(form, f"conn_{f}").strip() for f in sorted(schema.strings | schema.integers | schema.booleans)}
    secrets = {s: _text(form, f"conn_{s}") for s in sorted(schema.secrets)}
    return {
        "name": _text(form, "name"),
        "environment_type": _choice(form, "environment_type", ENVIRONMENT_TYPES, problems),
        "dbt_version": _text(form, "dbt_version"),
        "git_branch": _text(form, "git_branch"),
        "connection": projects_pb2.Connection(
            adapter_type=adapter,
            fields={f: value for f, value in typed.items() if value},
            secret_fields={s: value for s, value in secrets.items() if value.strip()},
        ),
        "target_name": _text(form, "target_name"),
        "schema": _text(form, "schema"),
        "threads": checked_number(_text(form, "threads"), "threads", problems),
        "variables": problems.check(lambda: variables(_text(form, "variables"), "variables"), dict[str, str]()),
    }


def _all_refused(
    problems: Problems,
    message: projects_pb2.CreateEnvironmentRequest | projects_pb2.UpdateEnvironmentRequest,
    project_id: int,
    versions: InstalledDbtVersions,
    warehouses: WarehouseFiles,
) -> None:
    """A form it could not read whole is refused with the API's own refusals of the rest beside them."""
    if problems.found:
        problems.check(
            lambda: environment_spec(message, versions=versions, warehouses=warehouses, project_id=project_id), None
        )
        problems.raise_any()


async def _save_environment(
    request: Request,
    account_id: AccountId,
    problems: Problems,
    message: projects_pb2.CreateEnvironmentRequest | projects_pb2.UpdateEnvironmentRequest,
    project_id: int,
) -> None:
    """The form's environment created or updated, as every door saves one."""
    versions, warehouses = dbt_versions_of(request), warehouses_of(request)
    _all_refused(problems, message, project_id, versions, warehouses)
    store = store_of(request)
    if isinstance(message, projects_pb2.CreateEnvironmentRequest):
        await create_environment(store, lambda: _box(request), versions, account_id, message, warehouses=warehouses)
    else:
        await update_environment(store, lambda: _box(request), versions, account_id, message, warehouses=warehouses)


async def _environment(store: Store, account_id: AccountId, environment_id: int) -> Environment:
    async with store.connection() as conn:
        row = await store.get_environment(conn, account_id, environment_id)
    if row is None:
        raise NotFound(f"environment {environment_id} not found")
    return row


async def _environment_context(
    request: Request, who: Viewer, project: Project, environment: Environment | None, form_adapter: str = ""
) -> dict[str, Any]:
    store = store_of(request)
    async with store.connection() as conn:
        environments = await store.list_environments(conn, who.account_id, None)
    adapter = _chosen_adapter(form_adapter or request.query_params.get("adapter", ""), environment)
    return {
        "project": project,
        "environment": environment,
        # offered as suggestions: what this installation runs, else what the account's environments use
        "dbt_versions": sorted(dbt_versions_of(request).versions or {str(e.dbt_version) for e in environments}),
        "adapter": adapter,
        "adapters": sorted(ADAPTERS),
        "connection_fields": connection_inputs(adapter, environment.connection_secrets if environment else []),
    }


def _chosen_adapter(asked: str, environment: Environment | None) -> str:
    """The warehouse whose fields the form shows: the one asked for (``?adapter=``, or the refused form's),
    else the environment's, else Postgres."""
    if asked in ADAPTERS:
        return asked
    return environment.adapter_type if environment is not None else ADAPTER


@router.get("/projects/{project_id}/environments/new", response_class=HTMLResponse)
async def new_environment(request: Request, who: Looking, project_id: int) -> HTMLResponse:
    project = await _project(store_of(request), who.account_id, project_id)
    context = await _environment_context(request, who, project, None)
    values = _environment_values(None, context["adapter"])
    return await page(request, "environment_form.html", who, values=values, errors=FormErrors(), **context)


@router.post("/projects/{project_id}/environments/new", response_model=None)
async def create_environment_form(request: Request, who: Changing, project_id: int) -> Response:
    form = await request.form()
    store = store_of(request)
    project = await _project(store, who.account_id, project_id)
    try:
        problems = Problems()
        message = projects_pb2.CreateEnvironmentRequest(project_id=project_id, **_environment_request(form, problems))
        await _save_environment(request, who.account_id, problems, message, project_id)
    except InvalidArgument as exc:
        context = await _environment_context(request, who, project, None, _text(form, "adapter_type"))
        return await _refused(request, who, "environment_form.html", exc, ENVIRONMENT_FIELDS, **context)
    return see_other(f"/ui/projects#project-{project_id}")


@router.get("/environments/{environment_id}/edit", response_class=HTMLResponse)
async def edit_environment(request: Request, who: Looking, environment_id: int) -> HTMLResponse:
    store = store_of(request)
    environment = await _environment(store, who.account_id, environment_id)
    project = await _project(store, who.account_id, environment.project_id)
    context = await _environment_context(request, who, project, environment)
    values = _environment_values(environment) | {"adapter_type": context["adapter"]}
    return await page(request, "environment_form.html", who, values=values, errors=FormErrors(), **context)


@router.post("/environments/{environment_id}/edit", response_model=None)
async def update_environment_form(request: Request, who: Changing, environment_id: int) -> Response:
    form = await request.form()
    store = store_of(request)
    environment = await _environment(store, who.account_id, environment_id)
    project = await _project(store, who.account_id, environment.project_id)
    try:
        problems = Problems()
        message = projects_pb2.UpdateEnvironmentRequest(
            environment_id=environment_id,
            clear_secret_fields=[s for s in CONNECTION_SECRETS if _checked(form, f"clear_{s}")],
            expected_version=_version(form),
            **_environment_request(form, problems),
        )
        await _save_environment(request, who.account_id, problems, message, project.id)
    except InvalidArgument as exc:
        context = await _environment_context(request, who, project, environment, _text(form, "adapter_type"))
        return await _refused(request, who, "environment_form.html", exc, ENVIRONMENT_FIELDS, **context)
    except VersionConflict as exc:
        now = await _environment(store, who.account_id, environment_id)
        context = await _environment_context(request, who, project, now, _text(form, "adapter_type"))
        values = _environment_values(now)
        return await _conflicted(
            request, who, "environment_form.html", exc, known=ENVIRONMENT_FIELDS, now=values, **context
        )
    return see_other(f"/ui/projects#project-{project.id}")
